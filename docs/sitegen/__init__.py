"""Builds the generated part of the spec site from gptspec.spec (see docs/hooks.py).

Everything here writes into docs/generated/ (gitignored); the MkDocs hook adds those
files to the build. Nothing here is a project API: it is the site's build code.
"""
