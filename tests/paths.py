"""Repository paths used by tests."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMBEDDED = REPO / "embedded"
EMBEDDED_TARGET = EMBEDDED / "target"
