"""Reading the user's files: one mapping from JSON or YAML (``yaml.safe_load`` only), one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from planner.errors import InputError


def read_mapping(path: str | Path, what: str, *, missing_hint: str = "") -> dict:
    """The mapping in ``path`` (JSON when it ends in .json, else YAML); InputError naming ``what`` otherwise."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {path} does not exist{missing_hint}")
    text = p.read_text()
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise InputError(f"malformed {what} {path}: {str(err).splitlines()[0]}; fix the syntax") from None
    if not isinstance(data, dict):
        raise InputError(f"malformed {what} {path}: expected a mapping of keys")
    return data
