"""Issue 74, a thin driver: the checks before the SCF in `api.checks`, the flow in `api.driver`; each
check, the timer's wrap and the checkpoint's open once per run; the result holding its parts and
flattened once (its JSON record as it was); the drop-in's Settings built by name."""

import json
import os
from dataclasses import fields

import numpy as np
import pytest

from conftest import ROOT
from dfmp2.api import checks, driver
from dfmp2.mp2 import pipeline
from dfmp2.run.context import Timer
from dfmp2.run.settings import Settings

WATER = os.path.join(ROOT, "examples", "water.xyz")
BASE_RECORD = os.path.join(ROOT, "tests", "data", "water_record_2cde9af.json")
# keys the record gained after 2cde9af, with a canonical MP2 run's values: the method (issue 75),
# its opposite-spin scaling (None: MP2's own) and the Laplace quadrature (None: not used)
ADDED_SINCE_BASE = {"method": "mp2", "c_os": None, "laplace": None}


@pytest.fixture
def counted(monkeypatch):
    """{name: calls} of check_request, Timer.synchronized_with, open_run_checkpoint and the spin
    channels' making (orbitals.spin_channels), wherever called."""
    counts = {"check_request": 0, "synchronized_with": 0, "open_run_checkpoint": 0, "spin_channels": 0}

    def counting(name, real):
        def wrapper(*args, **kw):
            counts[name] += 1
            return real(*args, **kw)
        return wrapper

    for module in (checks, pipeline):
        monkeypatch.setattr(module, "check_request", counting("check_request", pipeline.check_request))
    for module in (driver, pipeline):
        monkeypatch.setattr(module, "open_run_checkpoint",
                            counting("open_run_checkpoint", pipeline.open_run_checkpoint))
    monkeypatch.setattr(Timer, "synchronized_with", counting("synchronized_with", Timer.synchronized_with))
    for module in (driver, pipeline):
        monkeypatch.setattr(module, "spin_channels", counting("spin_channels", pipeline.spin_channels))
    return counts


def test_a_molecule_s_run_checks_wraps_its_timer_and_opens_its_checkpoint_once(counted, tmp_path):
    driver.run_xyz(WATER, checkpoint=str(tmp_path / "ck"))
    assert counted == {"check_request": 1, "synchronized_with": 1, "open_run_checkpoint": 1, "spin_channels": 1}


def test_a_mean_field_s_run_checks_wraps_its_timer_and_opens_its_checkpoint_once(counted):
    from dfmp2 import DFMP2
    from conftest import converged_rhf

    DFMP2(converged_rhf("water", "cc-pvdz")).kernel()
    assert counted == {"check_request": 1, "synchronized_with": 1, "open_run_checkpoint": 1, "spin_channels": 1}


def test_the_pipeline_s_own_entry_still_checks_its_request():
    """dfmp2_energy (bench, the tests) makes the decisions the driver makes for its runs."""
    from dfmp2.kernels import get_backend
    from dfmp2.util.errors import InputError

    with pytest.raises(InputError, match="given \\(ia\\|P\\) integrals"):
        pipeline.dfmp2_energy(get_backend("cpu"), None, np.eye(2), np.array([-1.0, 1.0]), np.array([2.0, 0.0]),
                              checkpoint="ck", given=[None])


def _shape(value):
    return {k: _shape(v) for k, v in value.items()} if isinstance(value, dict) else type(value).__name__


def test_the_json_record_is_the_one_before_the_split():
    """The record flattened from the result's parts has the keys, and the values, of commit 2cde9af's."""
    base = json.load(open(BASE_RECORD))
    result = driver.run_xyz(WATER)
    record = json.loads(json.dumps(result.as_dict()))
    for name, value in ADDED_SINCE_BASE.items():
        assert record.pop(name) == value, name
    shape = _shape(record)
    for volatile in ("cpu_configuration", "timings"):
        shape[volatile] = "dict"
    shape["memory"]["limits"] = "list"
    assert shape == base["keys"]
    for name, value in base["values"].items():
        if isinstance(value, float):
            assert record[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
        else:
            assert record[name] == value, name
    assert sorted(driver.run_xyz(WATER, gradient=True, properties=("dipole",)).as_dict()) == sorted(
        base["grad_dipole_keys"] + list(ADDED_SINCE_BASE))
    # the parts, and what users read from them
    assert result.ran.device == result.device == "cpu" and result.backend == result.ran.name
    assert result.e_corr == result.correlation.e_corr and result.e_tot == result.e_ref + result.e_corr
    assert result.scf_record["scf_backend"] == record["scf_backend"]


def test_every_settings_field_is_set_by_the_drop_in_or_said_not_to_be():
    """A new Settings field fails here until it is mapped (SETTINGS_OF_ATTRIBUTES) or listed as
    NOT_FOR_THE_DROP_IN."""
    from dfmp2.api.pyscf_base import NOT_FOR_THE_DROP_IN, SETTINGS_OF_ATTRIBUTES

    names = {field.name for field in fields(Settings)}
    mapped = set(SETTINGS_OF_ATTRIBUTES.values())
    assert not mapped & NOT_FOR_THE_DROP_IN
    assert mapped | NOT_FOR_THE_DROP_IN == names, sorted(names ^ (mapped | NOT_FOR_THE_DROP_IN))


def test_the_drop_in_s_settings_are_its_attributes_by_name():
    from dfmp2 import DFMP2
    from dfmp2.api.pyscf_base import SETTINGS_OF_ATTRIBUTES
    from conftest import converged_rhf

    pt = DFMP2(converged_rhf("water", "cc-pvdz"), frozen=1, device="cpu", precision="fp32")
    pt.max_memory, pt.checkpoint, pt.force_outcore, pt.include_singles = 1234, "ck", True, False
    settings = pt.settings()
    assert {f: getattr(settings, f) for f in SETTINGS_OF_ATTRIBUTES.values()} == {
        f: getattr(pt, a) for a, f in SETTINGS_OF_ATTRIBUTES.items()}
    assert pt.settings(with_t2=False).with_t2 is False
