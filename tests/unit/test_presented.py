"""errors.presented: what reaches a task or a member from the gang's own machinery is said as an
error of the package, with its cause and what to do, never as Metaflow's `Internal error`
(issue 42). The real runs are in tests/e2e/test_no_internal_error.py."""

import errno

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest
from botocore.exceptions import ClientError, NoCredentialsError
from metaflow.exception import MetaflowException

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError,
    TorchDistributedEnvironmentError,
    TorchDistributedUnexpectedError,
    presented,
)


@pytest.mark.parametrize("ex,cls,words", [
    (OSError(errno.ENOSPC, "No space left on device", "/tmp/torch-distributed-x"),
     TorchDistributedEnvironmentError, ["No space left on device", "free disk space"]),
    (PermissionError(errno.EACCES, "Permission denied", "/tmp/x"),
     TorchDistributedEnvironmentError, ["PermissionError", "make writable the folder"]),
    (ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed s3:GetObject"}},
                 "GetObject"),
     TorchDistributedEnvironmentError, ["AccessDenied", "not allowed s3:GetObject",
                                        "give the job's role", "preflight"]),
    (NoCredentialsError(), TorchDistributedEnvironmentError, ["Unable to locate credentials"]),
    (RuntimeError("a bug"), TorchDistributedUnexpectedError,
     ["RuntimeError: a bug", "Please report it", "Traceback"]),
])
def test_each_kind_of_error_is_said_with_its_cause_and_what_to_do(ex, cls, words):
    try:
        raise ex
    except Exception as raised:
        ours = presented("train", raised)
    assert type(ours) is cls and isinstance(ours, MetaflowException)
    message = str(ours)
    assert message.startswith("@torch_distributed on step *train*: ")
    assert all(w in message for w in words), message


@pytest.mark.parametrize("ex", [TorchDistributedConfigError("train", "bad"),
                                KeyboardInterrupt(), SystemExit(3)])
def test_what_is_already_said_or_no_error_is_left_alone(ex):
    assert presented("train", ex) is None
