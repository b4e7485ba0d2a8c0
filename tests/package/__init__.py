"""Tests of the package as a whole: its layout rule, the README, docs/ and the API doc, the notebooks, the wheel."""
