"""A fake torchtitan for plantune's tests (tests/fake_torchtitan/torchtitan/train.py)."""

__version__ = "0.3.0"
