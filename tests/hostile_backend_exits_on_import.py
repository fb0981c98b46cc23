"""A backend module that calls sys.exit(0) on import (see hostile_backends.py)."""

import sys

sys.exit(0)
