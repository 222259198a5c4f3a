"""Job bodies for tests that submit through submitit (importable by the job's process, which
unpickles them by module name: tests/ is on its PYTHONPATH through the user_pythonpath fixture)."""


def finish_with(result):
    """Return ``result``, or raise it when it is an exception."""
    if isinstance(result, BaseException):
        raise result
    return result
