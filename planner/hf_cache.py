"""A model named by its Hugging Face repository id, read from the local Hugging Face cache (no network).

huggingface_hub keeps a repository under ``<cache>/models--<org>--<name>/`` with ``refs/<branch>`` holding a commit
hash and ``snapshots/<commit>/`` the files of that commit (huggingface_hub's cache layout, "Manage
huggingface_hub cache-system"). The cache is ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub`` (huggingface_hub constants.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from planner.errors import InputError

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""a Hugging Face repository id, org/name (a local path starts with / or . or has more parts)"""
_SNAPSHOT_DIR = re.compile(r"^models--(.+?)--(.+)$")


def cache_dir(env: dict | None = None) -> Path:
    """The hub cache huggingface_hub would use with this environment."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def repo_of_snapshot(folder: Path) -> str:
    """"org/name" when ``folder`` is a snapshot in the cache (``models--org--name/snapshots/<commit>``); "" else."""
    folder = Path(folder)
    if folder.parent.name != "snapshots":
        return ""
    m = _SNAPSHOT_DIR.match(folder.parent.parent.name)
    return f"{m.group(1)}/{m.group(2)}" if m else ""


def cached_config(repo_id: str, env: dict | None = None) -> Path:
    """The config.json of ``repo_id`` in the local cache: the snapshot refs/main names, else the newest snapshot
    holding one; InputError naming the folder searched when the cache has none."""
    root = cache_dir(env) / f"models--{repo_id.replace('/', '--')}"
    ref = root / "refs" / "main"
    if ref.is_file():
        chosen = root / "snapshots" / ref.read_text().strip() / "config.json"
        if chosen.is_file():
            return chosen
    found = sorted((p for p in (root / "snapshots").glob("*/config.json") if p.is_file()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if found:
        return found[0]
    raise InputError(f"model {repo_id!r} is not a preset, a file, or a repository in the local Hugging Face cache "
                     f"({root} has no snapshots/*/config.json); download it (huggingface-cli download {repo_id} "
                     "config.json) or give the path of its config.json or snapshot folder")


__all__ = ["REPO_ID", "cache_dir", "cached_config", "repo_of_snapshot"]
