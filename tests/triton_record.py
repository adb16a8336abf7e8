"""Record every Triton kernel launch the interpreter runs, for ``scripts/triton-compile-check.sh``.

Active only where ``GNNIO_TRITON_RECORD`` names an output prefix: each process appends one JSON
line per distinct launch to ``PREFIX.PID`` -- ``[module, kernel, args, kwargs]``, each argument
as its compile-relevant spec: a tensor's dtype and 16-byte alignment, an integer's class (0, 1,
a multiple of 16 or not, below 2^31 or not: what Triton specializes on; a ``tl.constexpr``
argument exactly), a float, None. As a pytest plugin (``-p tests.triton_record``) it hooks the
pytest process; :mod:`tests.interpreter_speedup`, imported first by every script of
:func:`tests.helpers.run_in_triton_interpreter`, hooks those children. Recording never breaks
a run."""

from __future__ import annotations

import inspect
import json
import os

ENV = "GNNIO_TRITON_RECORD"
_seen: set[str] = set()


def int_class(v: int) -> int:
    """The value standing for ``v`` when compiling: Triton specializes on 0/1 (constants), on
    divisibility by 16 and on fitting in 32 bits."""
    if v in (0, 1):
        return v
    return (1 << 33 if abs(v) >= 2**31 else 0) + (32 if v % 16 == 0 else 7)


def spec(v, constexpr: bool = False) -> list:
    import torch

    if isinstance(v, torch.Tensor):
        return ["T", str(v.dtype).replace("torch.", ""), v.data_ptr() % 16 == 0]
    if isinstance(v, bool) or constexpr or v is None or isinstance(v, float):
        return ["C", v] if isinstance(v, (bool, int, float, type(None))) else ["R", repr(v)[:80]]
    if isinstance(v, int):
        return ["I", int_class(v)]
    return ["R", repr(v)[:80]]  # (the compile step reports it as unrecordable)


def install() -> bool:
    """Wrap the interpreter's launch (once); whether recording is on."""
    out = os.environ.get(ENV)
    if not out:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    orig = InterpretedFunction.run
    if getattr(orig, "gnnio_recording", False):
        return True

    def run(self, *args, grid, warmup, **kwargs):
        try:
            params = list(inspect.signature(self.fn).parameters.values())
            const = ["constexpr" in str(p.annotation) for p in params]
            a = [spec(v, i < len(const) and const[i]) for i, v in enumerate(args)]
            kw = {k: spec(v, True) for k, v in kwargs.items()}
            key = json.dumps([self.fn.__module__, self.fn.__qualname__, a, kw], sort_keys=True)
            if key not in _seen:
                _seen.add(key)
                with open(f"{out}.{os.getpid()}", "a") as f:
                    f.write(key + "\n")
        except Exception as e:  # noqa: BLE001 - never break the run
            print(f"triton_record: not recorded: {e}", flush=True)
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.gnnio_recording = True  # type: ignore[attr-defined]
    InterpretedFunction.run = run
    return True


def pytest_configure(config) -> None:  # noqa: ARG001 - pytest's hook signature
    if os.environ.get(ENV) and os.environ.get("TRITON_INTERPRET") == "1":
        install()
