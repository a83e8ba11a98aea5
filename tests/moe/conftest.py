from __future__ import annotations

from tests.virtual_gpu.conftest import user_python  # noqa: F401  (the traced process's torch build)
