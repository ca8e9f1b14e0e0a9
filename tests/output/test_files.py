"""Class 1 of issue 11: outputs replace regular files atomically with the mode a plain write gives, write to
stdout, devices and FIFOs without replacing them, follow symbolic links, take names up to 255 bytes, and are
refused when they would overwrite an input. Every target lives in a temporary folder: /dev/null-like nodes are
made there (os.mknod of the null device's numbers where permitted, os.mkfifo), never touched in /dev."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tfcalc.cli import app
from tfcalc.errors import OutputError, UsageError
from tfcalc.output.files import TEMP_PREFIX, check_outputs, open_output, write_atomic

runner = CliRunner()
NULL_DEVICE = os.makedev(1, 3)  # Linux's /dev/null numbers: writes are discarded, nothing can be damaged


def make_null_device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, NULL_DEVICE)
        with open(path, "w") as probe:
            probe.write("")
    except (OSError, AttributeError) as exc:  # not root, a nodev mount, or no mknod on this system
        pytest.skip(f"cannot make a character device here: {exc}")


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def read_fifo_in_background(path: Path) -> tuple[threading.Thread, list[bytes]]:
    received: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as fifo:
            received.append(fifo.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, received


class umask_set:  # noqa: N801 - used as a context manager
    def __init__(self, mask: int) -> None:
        self.mask = mask

    def __enter__(self) -> None:
        self.old = os.umask(self.mask)

    def __exit__(self, *exc: object) -> None:
        os.umask(self.old)


@settings(max_examples=40)
@given(kind=st.sampled_from(["missing", "regular", "symlink", "dangling-symlink"]),
       existing_mode=st.sampled_from([0o600, 0o640, 0o644, 0o664, 0o604, 0o400]),
       umask=st.sampled_from([0o022, 0o077, 0o002, 0o027]), binary=st.booleans())
def test_regular_targets_are_replaced_atomically_with_a_plain_writes_mode(
        tmp_path_factory: pytest.TempPathFactory, kind: str, existing_mode: int, umask: int, binary: bool) -> None:
    folder = tmp_path_factory.mktemp("out")
    target = folder / "result.csv"
    given_path = target
    if kind in ("regular", "symlink"):
        target.write_text("old\n")
        os.chmod(target, existing_mode)
    if kind in ("symlink", "dangling-symlink"):
        given_path = folder / "link.csv"
        given_path.symlink_to(target.name)
    payload = "new,é\n"
    with umask_set(umask), open_output(given_path, binary=binary) as handle:
        handle.write(payload.encode() if binary else payload)
    assert target.read_text(encoding="utf-8") == payload
    assert stat.S_ISREG(os.lstat(target).st_mode)
    expected = existing_mode if kind in ("regular", "symlink") else 0o666 & ~umask
    assert stat.S_IMODE(os.stat(target).st_mode) == expected
    if kind != "missing" and kind != "regular":
        assert os.path.islink(given_path) and os.readlink(given_path) == target.name  # the link stays a link
    assert leftovers(folder) == []


def test_fifo_is_written_to_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, received = read_fifo_in_background(fifo)
    write_atomic(fifo, "rows\n")
    thread.join(timeout=10)
    assert received == [b"rows\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


def test_character_device_is_written_to_not_replaced(tmp_path: Path) -> None:
    device = tmp_path / "null"
    make_null_device(device)
    result = runner.invoke(app, ["kv-cache", "-p", "llama3-8b", "-f", "csv", "-o", str(device)])
    assert result.exit_code == 0, result.output
    mode = os.lstat(device)
    assert stat.S_ISCHR(mode.st_mode) and mode.st_rdev == NULL_DEVICE
    link = tmp_path / "null-link"
    link.symlink_to(device)
    assert runner.invoke(app, ["kv-cache", "-p", "llama3-8b", "-o", str(link)]).exit_code == 0
    assert os.path.islink(link) and stat.S_ISCHR(os.lstat(device).st_mode)


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_stdout_names_write_to_stdout(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_output(name) as handle:
        handle.write("to stdout\n")
    assert capsys.readouterr().out == "to stdout\n"


def test_dev_stdout_on_the_command_line_appends_to_a_redirected_file(tmp_path: Path) -> None:
    """`-o /dev/stdout >> log` appends: stdout is written to, the file behind it is neither replaced nor cut."""
    log = tmp_path / "log.csv"
    log.write_text("kept\n")
    with open(log, "a") as stdout:
        done = subprocess.run([sys.executable, "-m", "tfcalc", "kv-cache", "-p", "llama3-8b", "-f", "csv", "-o",
                               "/dev/stdout"], stdout=stdout, stderr=subprocess.PIPE, text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "kept" and lines[1].startswith("model,") and len(lines) == 3


@pytest.mark.parametrize("length", [242, 250, 255])
def test_names_up_to_255_bytes(tmp_path: Path, length: int) -> None:
    target = tmp_path / ("n" * (length - 4) + ".csv")
    write_atomic(target, "x\n")
    write_atomic(target, "y\n")
    assert target.read_text() == "y\n" and leftovers(tmp_path) == []


def test_refused_targets_leave_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="is a folder"):
        write_atomic(tmp_path, "x")
    with pytest.raises(OutputError, match="does not exist"):
        write_atomic(tmp_path / "no" / "x.csv", "x")
    with pytest.raises(OutputError, match="no such device"):
        write_atomic("/dev/tfcalc-typo-of-null", "x")
    assert not Path("/dev/tfcalc-typo-of-null").exists()
    assert list(tmp_path.iterdir()) == []


def test_failure_mid_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), open_output(target) as handle:
        handle.write("half")
        raise RuntimeError("stopped")
    with pytest.raises(KeyboardInterrupt), open_output(target) as handle:
        handle.write("half")
        raise KeyboardInterrupt
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_outputs_that_are_inputs_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "model.yaml"
    source.write_text("x: 1\n")
    hard = tmp_path / "hard.yaml"
    os.link(source, hard)
    soft = tmp_path / "soft.yaml"
    soft.symlink_to(source)
    for spelling in (source, hard, soft, Path(os.path.relpath(source))):
        with pytest.raises(UsageError, match="refusing to overwrite an input"):
            check_outputs([("--output", spelling)], [("--preset", str(source))])
    with pytest.raises(UsageError, match="give each output its own file"):
        check_outputs([("--output", tmp_path / "a.csv"), ("--save-calibration", tmp_path / "a.csv")])
    with pytest.raises(UsageError, match="its own file"):
        check_outputs([("--output", Path("-")), ("--plot", Path("/dev/stdout"))])
    check_outputs([("--output", Path("/dev/null")), ("--plot", Path("/dev/null"))])  # devices may be shared
    assert source.read_text() == "x: 1\n"


def _tiny_config(path: Path) -> None:
    path.write_text(json.dumps({"model_type": "llama", "vocab_size": 1000, "hidden_size": 256,
                                "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4}))


@pytest.mark.parametrize("case", ["preset", "config", "calibration", "save-calibration", "plot", "profile-plot",
                                  "profile-calibration", "profile-preset", "engine", "interconnect", "inter-node"])
def test_cli_refuses_to_overwrite_an_input_before_any_work(tmp_path: Path, case: str) -> None:
    yaml_model = tmp_path / "mine.yaml"
    yaml_model.write_text("vocab_size: 100\nhidden_size: 64\nnum_layers: 2\nnum_attention_heads: 4\n"
                          "num_kv_heads: 4\nhead_dim: 16\nintermediate_size: 128\n")
    config = tmp_path / "config.json"
    _tiny_config(config)
    calibration = tmp_path / "cal.json"
    calibration.write_text("{}\n")
    engine, link = tmp_path / "engine.yaml", tmp_path / "link.yaml"
    engine.write_text("name: mine\n")
    link.write_text("name: mine\n")
    args = {
        "preset": ["kv-cache", "-p", str(yaml_model), "-f", "csv", "-o", str(yaml_model)],
        "config": ["params", "-c", str(config), "-o", str(config)],
        "calibration": ["estimate", "-p", "llama3-8b", "--calibration", str(calibration), "-o", str(calibration)],
        # Refused before the profiler imports torch or measures anything.
        "save-calibration": ["profile", "--device", "cpu", "-o", str(tmp_path / "p.json"), "--save-calibration",
                             str(tmp_path / "p.json")],
        "plot": ["plan", "-p", "llama3-8b", "-o", str(tmp_path / "x.png"), "--plot", str(tmp_path / "x.png"),
                 "-f", "csv"],
        "profile-plot": ["profile", "--device", "cpu", "-f", "csv", "-o", str(tmp_path / "t.png"), "--plot",
                         str(tmp_path / "t.png")],
        "profile-calibration": ["profile", "--device", "cpu", "--calibration", str(calibration),
                                "--save-calibration", str(calibration)],
        "profile-preset": ["profile", "--device", "cpu", "-p", str(yaml_model), "-f", "csv", "-o", str(yaml_model)],
        "engine": ["estimate", "-p", "llama3-8b", "-e", str(engine), "-f", "csv", "-o", str(engine)],
        "interconnect": ["estimate", "-p", "llama3-8b", "--tp", "2", "--interconnect", str(link), "-f", "csv", "-o",
                         str(link)],
        "inter-node": ["estimate", "-p", "llama3-8b", "--tp", "8", "--pp", "2", "--inter-node", str(link), "-f",
                       "csv", "-o", str(link)],
    }[case]
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("overwrite an input" in errors[0] or "its own file" in errors[0])
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="is not writable"):
            check_outputs([("--save-calibration", folder / "cal.json")])
    finally:
        folder.chmod(0o755)


def test_bundled_presets_are_inputs_too() -> None:
    from tfcalc.spec.presets import preset_path

    path = preset_path("model", "llama3-8b")
    before = path.read_bytes()
    for args in (["kv-cache", "-p", "llama3-8b", "-f", "csv", "-o", str(path)],
                 ["presets", "show", "llama3-8b", "-f", "csv", "-o", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "overwrite an input" in result.output or "inside tfcalc's preset folder" in result.output
    assert path.read_bytes() == before
    engine = preset_path("engine", "vllm-0.21")
    before = engine.read_bytes()
    for target in (engine, engine.parent / "new.csv"):   # -e vllm names no file; the preset folder is refused
        result = runner.invoke(app, ["estimate", "-p", "llama3-8b", "-e", "vllm", "-f", "csv", "-o", str(target)])
        assert result.exit_code == 2 and "inside tfcalc's preset folder" in result.output, result.output
    assert engine.read_bytes() == before and not (engine.parent / "new.csv").exists()


def test_stdout_on_a_full_disk_or_closed() -> None:
    """/dev/full fails every write with ENOSPC; a closed stdout is None in Python: one line each, exit 1."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "tfcalc", "kv-cache", "-p", "llama3-8b"], stdout=full,
                              stderr=subprocess.PIPE, text=True, check=False, timeout=60)
    assert done.returncode == 1 and done.stderr == "error: cannot write to stdout: No space left on device\n"
    done = subprocess.run([sys.executable, "-m", "tfcalc", "kv-cache", "-p", "llama3-8b"], stderr=subprocess.PIPE,
                          text=True, check=False, timeout=60, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1 and done.stderr == "error: cannot write the result: stdout is closed\n"
