"""One rank under torchrun: the same work; rank 0 writes its result for the step to read."""

import os

import work

if __name__ == "__main__":
    result, _ = work.run(float(os.environ["BENCH_TASK_CREATED"]))
    if os.environ["RANK"] == "0":
        work.write(os.path.join(os.environ["BENCH_OUT"], "rank0.json"), result)
