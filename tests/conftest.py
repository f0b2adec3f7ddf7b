"Run folders made during tests go to a temporary folder, never the project's `outputs/`."
import os
import pytest


@pytest.fixture(autouse=True, scope='session')
def temporary_outputs(tmp_path_factory):
    saved = os.environ.get('WORLDLAB_OUTPUTS')
    os.environ['WORLDLAB_OUTPUTS'] = str(tmp_path_factory.mktemp('outputs'))   # subprocesses inherit it
    yield
    if saved is None: os.environ.pop('WORLDLAB_OUTPUTS')
    else: os.environ['WORLDLAB_OUTPUTS'] = saved
