"""Shared fixtures for the WebShop environment tests."""

import warnings
from pathlib import Path

import pytest
from raw_products import tiny_raw

from webshop.catalogue import Catalogue

REAL_DATA_DIR = Path(__file__).resolve().parents[2] / '..' / 'shared' / 'webshop-1k'


@pytest.fixture(scope='session')
def tiny_catalogue(tmp_path_factory) -> Catalogue:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Catalogue.from_raw(tiny_raw(), cache_dir=tmp_path_factory.mktemp('cache'))


@pytest.fixture(scope='session')
def embedded() -> Catalogue:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Catalogue.embedded_default()


@pytest.fixture(scope='session')
def real_dir() -> Path:
    if not REAL_DATA_DIR.is_dir():
        pytest.skip(f'real WebShop 1k data not found at {REAL_DATA_DIR} (academic licence: it is not in the repo)')
    return REAL_DATA_DIR


@pytest.fixture(scope='session')
def real_catalogue(real_dir) -> Catalogue:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Catalogue.from_dir(real_dir)
