"""Shared by the tests of train.py and sample.py: the repo on sys.path and small prepared datasets."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import prepare  # noqa: E402


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """<tmp>/shakespeare_char: the first 200k characters of the corpus, prepared by prepare.py's writer."""
    root = tmp_path_factory.mktemp('data')
    prepare.prepare_char(prepare.read_shakespeare()[:200_000], str(root / 'shakespeare_char'))
    return str(root)


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
    """A dataset with only 200 validation tokens."""
    root = tmp_path_factory.mktemp('tinydata')
    prepare.prepare_char(prepare.read_shakespeare()[:2000], str(root / 'shakespeare_char'))
    return str(root)
