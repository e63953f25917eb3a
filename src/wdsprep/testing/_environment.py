"""What every test service gives its clients: `env` (the variables that point a client at it) and
`environment()`, which sets them in this process for the duration (its children inherit them)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


class WithEnvironment:
    """Mixin: a subclass gives `env`; `with service.environment(): ...` points this process at it."""

    env: dict[str, str]

    @contextlib.contextmanager
    def environment(self) -> Iterator[dict[str, str]]:
        env = self.env
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            yield env
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
