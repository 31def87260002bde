"""``auto_complete_config`` of a process-kind model, run in a process of its own.

Triton's stub runs it; here too the server never imports the model file of a model whose
instances run in processes: its imports (torch, a package only its EXECUTION_ENV_PATH
holds), its module-level code and any crash stay out of the server. The process is
``python -m tritium.execution.process.autocomplete <model dir>`` in the model's own
environment: the config arrives on stdin, the answer leaves on a pipe of its own (the
model may print: stdout and stderr stay the server's).

The answer is one ``messages.CompletedConfig`` in the channel's codec.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError

MODULE = "tritium.execution.process.autocomplete"
ANSWER_FD_ENV = "TRITIUM_AUTOCOMPLETE_FD"
TIMEOUT_S = 300.0


def complete_in_process(model_dir: Path, config: Any) -> Any:
    """The completed config, as ``loader.auto_complete_config`` returns it in process (blocking: the
    repository calls it off the event loop)."""
    from tritium.execution.process import environment

    env = environment.resolve(config, str(model_dir))
    command = (env.command(MODULE, [str(model_dir)]) if env is not None
               else [sys.executable, "-m", MODULE, str(model_dir)])
    spawn_env = env.spawn_env(os.environ) if env is not None else dict(os.environ)
    read_end, write_end = os.pipe()
    spawn_env[ANSWER_FD_ENV] = str(write_end)
    try:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, pass_fds=[write_end],
                                   env=spawn_env)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, "rb") as answers:
        try:
            process.communicate(config.SerializeToString(), timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise TritiumError(ErrorCode.INVALID_ARG, (
                f"auto_complete_config function in model '{config.name}' did not return "
                f"within {TIMEOUT_S:.0f} s")) from None
        answer = answers.read()
    return _answer(config, answer, process.returncode)


def _answer(config: Any, answer: bytes, returncode: int) -> Any:
    from tritium.execution.process.codec import FrameError, convert, unpack_value
    from tritium.execution.process.messages import CompletedConfig

    if answer:
        try:
            sent: CompletedConfig = convert(CompletedConfig, unpack_value(answer))
        except FrameError as exc:
            raise TritiumError(ErrorCode.INVALID_ARG, (
                f"auto_complete_config function in model '{config.name}' failed: its "
                f"process answered what is no config: {exc}")) from None
        if sent.error is not None:
            raise sent.error.error()
        if sent.config is not None:
            completed = type(config)()
            completed.ParseFromString(sent.config)
            return completed
    from tritium.execution.process.restart import describe_exit

    raise TritiumError(ErrorCode.INVALID_ARG, (
        f"auto_complete_config function in model '{config.name}' failed: its process "
        f"ended ({describe_exit(returncode)}) without answering"))


def main() -> int:
    answers = os.fdopen(int(os.environ.pop(ANSWER_FD_ENV)), "wb")
    from tritium.execution.process import death

    death.die_with_parent(None)
    from tritium.backends.python.errors import describe_exception
    from tritium.backends.python.loader import auto_complete_config
    from tritium.core.config_pb import model_config_pb2
    from tritium.execution.process.codec import pack_value
    from tritium.execution.process.messages import CompletedConfig, ErrorBody

    config = model_config_pb2.ModelConfig()
    config.ParseFromString(sys.stdin.buffer.read())
    try:
        completed = auto_complete_config(Path(sys.argv[1]), config)
        answer = CompletedConfig(completed.SerializeToString(), None)
    except TritiumError as exc:
        answer = CompletedConfig(None, ErrorBody.of(exc))
    except BaseException as exc:
        answer = CompletedConfig(None, ErrorBody(ErrorCode.INVALID_ARG.name,
                                                 describe_exception(exc)))
    with answers:
        answers.write(pack_value(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
