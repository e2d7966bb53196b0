"""A test's marks from a node's shell, through S3 (moto's, with the endpoint and credentials a
node has), where no folder is shared with the test:

    python s3_mark.py put NAME          stdin becomes the object NAME under $MARKS
    python s3_mark.py wait NAME...      exits 0 once every NAME is there, 1 after 30 s

$MARKS is the test's prefix, s3://bucket/prefix (aws.Marks.url)."""

import os
import sys
import time

import boto3


def main(action, *names):
    bucket, _, prefix = os.environ["MARKS"][len("s3://"):].partition("/")
    s3 = boto3.client("s3")
    if action == "put":
        [name] = names
        s3.put_object(Bucket=bucket, Key="%s/%s" % (prefix, name),
                      Body=sys.stdin.buffer.read())
        return 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
        there = {o["Key"][len(prefix) + 1:] for o in listed.get("Contents", ())}
        if set(names) <= there:
            return 0
        time.sleep(0.1)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
