"""Settings travel as one object: `dfmp2 run`, `grad` and `optimize` split their options once, by
name, into the run's Settings and the job's own options (`jobs.JobOptions`, a typed object), and
`bench` passes its Settings-field options by name too. No module of the app layer carries options
in a SimpleNamespace or copies them into Settings one keyword at a time (a second list of the
options, which an option added to one list and not the other would silently leave behind)."""

import ast
import inspect
import pathlib
from dataclasses import fields

import click

from dfmp2.run.settings import Settings

APP = pathlib.Path(__file__).resolve().parent.parent / "dfmp2" / "app"
SETTINGS_FIELDS = {field.name for field in fields(Settings)}
SPELLED_MAX = 2  # keyword arguments a call of Settings in the app layer may spell out (a few derived ones)
SETTINGS_MAKERS = ("Settings", "settings_from")


def _callee(node) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def copied_settings(name: str, source: str) -> list:
    """Where a module spells out more than SPELLED_MAX keyword arguments in one call of Settings
    (or settings_from): options copied into Settings one by one (`**mapping` does not count)."""
    return [f"{name}:{node.lineno} {_callee(node)}(... {len(spelled)} keywords)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _callee(node) in SETTINGS_MAKERS
            for spelled in [[k for k in node.keywords if k.arg is not None]] if len(spelled) > SPELLED_MAX]


def namespace_uses(name: str, source: str) -> list:
    """Where a module uses types.SimpleNamespace (an untyped bag of options)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "types" \
                and any(alias.name == "SimpleNamespace" for alias in node.names):
            found.append(f"{name}:{node.lineno} from types import SimpleNamespace")
        elif isinstance(node, ast.Attribute) and node.attr == "SimpleNamespace":
            found.append(f"{name}:{node.lineno} .SimpleNamespace")
    return found


def _app_modules():
    return {path.stem: path.read_text() for path in sorted(APP.glob("*.py"))}


def test_no_app_module_copies_settings_one_by_one():
    findings = [f for name, source in _app_modules().items() for f in copied_settings(name, source)]
    assert not findings, findings


def test_no_app_module_uses_a_simple_namespace():
    findings = [f for name, source in _app_modules().items() for f in namespace_uses(name, source)]
    assert not findings, findings


def test_the_rules_catch_a_copy_and_a_namespace():
    copy = "def f(o):\n    return Settings(basis=o.basis, charge=o.charge, spin=o.spin)\n"
    assert copied_settings("m", copy) == ["m:2 Settings(... 3 keywords)"]
    assert copied_settings("m", "s = run.settings_from(None, a=1, b=2, c=3, **x)\n") == \
        ["m:1 settings_from(... 3 keywords)"]
    assert copied_settings("m", "s = Settings(precision=p, gradient=g, **options)\ns.replace(a=1, b=2, c=3)\n") == []
    assert namespace_uses("m", "from types import SimpleNamespace\n") == ["m:1 from types import SimpleNamespace"]
    assert namespace_uses("m", "import types\no = types.SimpleNamespace(**options)\n") == ["m:2 .SimpleNamespace"]
    assert namespace_uses("m", "from dataclasses import dataclass\n") == []


def unplaced_options(command: click.Command, job_fields: set) -> list:
    """The options of `command` that are neither a Settings field (same name) nor a field of the
    job's options type: an option no one takes."""
    return [param.name for param in command.params if param.name not in SETTINGS_FIELDS | job_fields]


def _job_options():
    from dfmp2.app import jobs

    job_options = getattr(jobs, "JobOptions", None)
    assert job_options is not None, "dfmp2.app.jobs has no JobOptions: the job's options travel untyped"
    return {field.name for field in fields(job_options)}


def test_every_option_is_a_setting_or_a_job_option():
    from dfmp2.app.cli import cli

    job_fields = _job_options()
    assert not job_fields & SETTINGS_FIELDS, f"in both Settings and JobOptions: {sorted(job_fields & SETTINGS_FIELDS)}"
    for name in ("run", "grad", "optimize"):
        assert not unplaced_options(cli.commands[name], job_fields), (name, unplaced_options(cli.commands[name], job_fields))
    bench = cli.commands["bench"]  # its own options are named parameters; the rest reach Settings by name
    named = {p.name for p in inspect.signature(bench.callback).parameters.values() if p.kind != p.VAR_KEYWORD}
    assert not unplaced_options(bench, named), unplaced_options(bench, named)


def test_the_rule_catches_an_option_no_one_takes():
    command = click.Command("c", params=[click.Option(["--basis"]), click.Option(["--json", "json_path"]),
                                         click.Option(["--colour"])])
    assert unplaced_options(command, {"json_path"}) == ["colour"]


def test_the_command_line_s_settings():
    """The split of `dfmp2 run`'s options: its defaults make Settings() but for the command's
    precision and charge and spin left to the molecule's file; --natorbs asks for the density,
    --properties is a list, grad asks for the gradient; the rest are the job's."""
    from dfmp2.app.cli import cli
    from dfmp2.app.jobs import JobOptions, command_options
    from dfmp2.kernels import COMMAND_PRECISION

    def split(command, *args, **split_args):
        options = cli.commands[command].make_context(command, ["w.xyz", *args]).params
        job, settings = command_options(options, **split_args)
        return job, Settings(**settings)

    job, settings = split("run", gradient=False)
    assert settings == Settings(precision=COMMAND_PRECISION, charge=None, spin=None)
    assert job == JobOptions(molecules=("w.xyz",))
    job, settings = split("grad", "--natorbs", "n.molden", "--properties", "dipole", "--precision", "FP64",
                          "--json", "o.json", gradient=True)
    assert settings == Settings(precision="fp64", charge=None, spin=None, with_rdm1=True, properties=("dipole",),
                                gradient=True)
    assert (job.natorbs_path, job.json_path) == ("n.molden", "o.json")
    job, settings = split("optimize", "--max-steps", "7", "--output", "o.xyz", gradient=True, optimize=True)
    assert (job.optimize, job.max_steps, job.output, job.trajectory, settings.gradient) == (True, 7, "o.xyz", None, True)
