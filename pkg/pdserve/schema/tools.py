"""The deployment's `tools` section: the executables the units call, and where a virtual environment keeps its
Python."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from pdserve.schema.fields import AbsolutePath, ExecutablePath, invalid
from pdserve.schema.systemd_syntax import executable_problem


class ToolPaths(BaseModel):
    """Executables the units call (NixOS passes store paths). numactl and pdserve, when unset, are found
    on PATH when rendering; the SGLang Python never is: a `python3` on PATH is rarely the one with the
    pinned sglang, so it is given (sglang_python) or found in a named virtual environment (sglang_venv)."""

    # As every section of the deployment (pdserve.schema.config._Section): no coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sglang_python: ExecutablePath | None = Field(
        None, description="Python with sglang and the router (smg); or set sglang_venv instead")
    sglang_venv: AbsolutePath | None = Field(
        None, description="Virtual environment with sglang and the router (smg): its bin/python is used "
        "(instead of sglang_python, not beside it)")
    numactl: ExecutablePath | None = None
    pdserve: ExecutablePath | None = None

    @field_validator("sglang_python")
    @classmethod
    def _sglang_python_directory_fits_path(cls, value: str | None) -> str | None:
        problem = value and search_path_problem(value)
        if problem:
            raise invalid(problem, SEARCH_PATH_FIX)
        return value

    @field_validator("sglang_venv")
    @classmethod
    def _one_runnable_sglang_python(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if info.data.get("sglang_python") is not None:  # declared above, so validated before this field
            raise invalid(
                f"is set beside tools.sglang_python ({info.data['sglang_python']}): two names for the SGLang Python",
                "keep one of tools.sglang_python and tools.sglang_venv",
            )
        # Its bin/python goes into ExecStart=: the same rules as any executable path.
        problem = executable_problem(venv_python(value))
        if problem:
            raise invalid(problem, "give the plain absolute path of the virtual environment's directory")
        problem = search_path_problem(venv_python(value))
        if problem:
            raise invalid(problem, SEARCH_PATH_FIX)
        return value


def venv_python(venv: str) -> str:
    """The Python of a virtual environment (what `python -m venv` and uv create)."""
    return f"{venv.rstrip('/')}/bin/python"


SEARCH_PATH_FIX = "install the SGLang environment in a directory whose path has no ':'"


def search_path_problem(python: str) -> str | None:
    """Why the directory of the SGLang Python cannot lead the servers' PATH (pdserve.render.argv puts it
    first, for FlashInfer's `ninja`), or None."""
    if ":" in posixpath.dirname(python):
        return ("has ':' in its directory, which the SGLang servers' units put first on PATH (FlashInfer runs "
                "`ninja` from there), where ':' separates entries")
    return None
