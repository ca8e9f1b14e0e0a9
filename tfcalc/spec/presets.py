"""The one place where preset and user YAML files become validated specs.

Model presets live in ``presets/models/NAME.yaml``, GPU presets in ``presets/gpus/NAME.yaml``, engine versions in
``presets/engines/`` and fabrics in ``presets/interconnects/``. The folder ships inside the wheel as
``tfcalc/_presets`` and is found beside the package in a checkout.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from tfcalc.errors import SpecError, UsageError
from tfcalc.spec.model import (
    HYBRID_BLOCKS,
    MAX_NAME_CHARS,
    CompressedAttentionSpec,
    EncoderSpec,
    FullAttentionSpec,
    LinearAttentionSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    RopeScaling,
    SparseIndexerSpec,
    WeightException,
    check_int,
    check_str,
    key_text,
)

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
PRESET_KINDS = ("model", "gpu", "engine", "interconnect")
_KIND_FOLDERS = {"model": "models", "gpu": "gpus", "interconnect": "interconnects", "engine": "engines"}

# Keys a preset may carry besides the spec's own fields: provenance, published figures and free notes (a model file's
# `source:` and `notes:` were ModelSpec fields once, never read: files that have them still load).
_DOC_KEYS = {"display_name", "sources", "published", "kind", "aliases", "notes", "source"}


def preset_root() -> Path:
    """``tfcalc/_presets`` in an installed wheel, else the checkout's top-level ``presets/``."""
    for candidate in (_PACKAGE_DIR / "_presets", _PACKAGE_DIR.parent / "presets"):
        if (candidate / "models").is_dir():
            return candidate
    raise SpecError(f"preset folder not found next to {_PACKAGE_DIR}; reinstall tfcalc")


def preset_names(kind: str = "model") -> list[str]:
    folder = preset_root() / _KIND_FOLDERS[kind]
    return sorted(p.stem for p in folder.glob("*.yaml"))


def suggest(name: str, choices: list[str], limit: int = 3) -> list[str]:
    """Closest names: difflib similarity first, then names sharing a substring."""
    import difflib

    lowered = name.lower()[:100]
    close = difflib.get_close_matches(lowered, choices, n=limit, cutoff=0.5)
    for choice in choices:
        if len(close) >= limit:
            break
        if choice not in close and (lowered in choice or choice in lowered):
            close.append(choice)
    return close


def unknown_name_error(kind: str, name: str, choices: list[str], or_file: bool = False) -> UsageError:
    """An unknown name (or, with ``or_file``, neither a preset nor an existing file: an unknown HF repo id) with the
    closest names."""
    hints = suggest(name, choices)
    hint = f"; did you mean {', '.join(hints)}?" if hints else f"; run 'tfcalc presets list --kind {kind}'"
    return UsageError(f"unknown {kind} preset '{name}'{' and no such file' if or_file else ''}{hint}")


# --- reading YAML and JSON with bounded time and memory ------------------------------------------------
# Presets are a few KiB and config.json files tens of KiB; calibration files (profile rows) a few MiB at most.
# YAML is parsed and built ~100x slower than JSON in Python, hence its lower limit.
MAX_YAML_BYTES = 1 << 20
MAX_JSON_BYTES = 4 << 20
# Values a YAML document may hold once aliases are expanded ("billion laughs": 9 aliases of 9 aliases...).
MAX_YAML_VALUES = 100_000
MAX_NESTING = 100


def _yaml_graph_check(root: Any, origin: str) -> None:
    """Refuse duplicate keys, recursive aliases, nesting deeper than MAX_NESTING and documents that expand to
    more than MAX_YAML_VALUES values; one pass over the node graph, each node once (aliases share nodes)."""
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    def children(node: Any) -> list[Any]:
        if isinstance(node, MappingNode):
            return [item for pair in node.value for item in pair]
        return list(node.value) if isinstance(node, SequenceNode) else []

    expanded: dict[int, int] = {}
    path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            path.discard(key)
            expanded[key] = 1 + sum(expanded[id(child)] for child in children(node))
            if expanded[key] > MAX_YAML_VALUES:
                raise SpecError(f"{origin}: the YAML expands to more than {MAX_YAML_VALUES:,} values (through "
                                "aliases); tfcalc's limit")
            continue
        if key in expanded:
            continue
        line = node.start_mark.line + 1
        if key in path:
            raise SpecError(f"{origin}: recursive YAML alias at line {line}")
        if len(path) >= MAX_NESTING:
            raise SpecError(f"{origin}: YAML nested deeper than {MAX_NESTING} levels at line {line}")
        if isinstance(node, MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    ident = (key_node.tag, key_node.value)
                    if ident in seen:
                        raise SpecError(f"{origin}: duplicate key '{key_text(key_node.value)}' at line "
                                        f"{key_node.start_mark.line + 1}")
                    seen.add(ident)
        path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children(node) if id(child) not in expanded)


def _load_yaml(text: str, origin: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _yaml_graph_check(node, origin)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class _DuplicateKey(ValueError):
    pass


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def read_data_file(path: Path | str, allow_list: bool = False, as_json: bool | None = None) -> Any:
    """Parse a YAML or JSON file into a mapping (or a list of mappings, if allowed), with one-line errors: JSON by a
    ``.json`` suffix, or always with ``as_json`` (a config.json read through a pipe or a file of another name, whose
    numbers such as ``25e-1`` YAML would read as text).

    Bounded: at most MAX_YAML_BYTES / MAX_JSON_BYTES read, aliases expanded to at most MAX_YAML_VALUES values,
    nesting at most MAX_NESTING; duplicate keys are refused (YAML and JSON alike) rather than the last one
    silently winning.
    """
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not a file")
    is_json = path.suffix.lower() == ".json" if as_json is None else as_json
    limit = MAX_JSON_BYTES if is_json else MAX_YAML_BYTES
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise SpecError(f"{path}: larger than {limit >> 20} MiB, tfcalc's limit for a {'JSON' if is_json else 'YAML'} "
                        "input")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    import json

    if not text.strip():
        raise SpecError(f"{path}: the file is empty")
    try:
        if is_json:
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = _load_yaml(text, str(path))
    except SpecError:
        raise
    except _DuplicateKey as exc:
        raise SpecError(f"{path}: duplicate key '{key_text(exc)}'") from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply") from None
    except Exception as exc:  # yaml.YAMLError and its subclasses; an int too long to convert
        if isinstance(exc, ValueError) and "digits" in str(exc):  # Python's 4,300-digit int conversion limit
            raise SpecError(f"{path}: a number with more than 4,300 digits") from None
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        what = "JSON" if is_json else "YAML"
        raise SpecError(f"{path}: malformed {what}{where}: {problem}") from None
    if allow_list and isinstance(data, list) and all(isinstance(item, dict) for item in data):
        return data
    if not isinstance(data, dict):
        found = ("nothing (an empty file or null)" if data is None else
                 {list: "a list", str: "text", bool: "a boolean", int: "a number", float: "a number"}.get(
                     type(data), type(data).__name__))
        raise SpecError(f"{path}: expected a mapping of fields at the top level, got {found}")
    return data


# --- preset names: names (case-insensitive, with aliases), never paths ---------------------------------
_NAME = r"[a-z0-9][a-z0-9._+-]*"
_ALIAS = rf"{_NAME}(/{_NAME})?"  # a name, or an owner/name repo id


def _preset_file(kind: str, name: str) -> Path:
    return preset_root() / _KIND_FOLDERS[kind] / f"{name}.yaml"


@functools.cache
def preset_aliases(kind: str) -> dict[str, str]:
    """Every alias of every preset of ``kind`` (lower case) -> the preset's name, from the presets' ``aliases``."""
    aliases: dict[str, str] = {}
    for name in preset_names(kind):
        document = read_data_file(_preset_file(kind, name))
        for alias in document.get("aliases") or []:
            key = str(alias).lower()
            if key in aliases and aliases[key] != name:
                raise SpecError(f"alias '{alias}' names both {aliases[key]} and {name} presets")
            aliases[key] = name
    return aliases


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name the file system refuses (longer than its 255 bytes: ENAMETOOLONG)."""
    try:
        return path.is_file()
    except OSError:
        return False


def find_preset(kind: str, name: str) -> str | None:
    """The preset called ``name`` (any case) or aliased so, else None. Only names in the preset folder's
    listing are ever turned into file names: ``../x`` is not a preset name."""
    key = name.strip().lower()
    if re.fullmatch(_NAME, key) and _is_file(_preset_file(kind, key)):  # a plain name: no separator, no dot first
        return key
    return preset_aliases(kind).get(key) if re.fullmatch(_ALIAS, key) else None


def resolve_preset(kind: str, name: str) -> str:
    """``find_preset`` or a UsageError with the closest names."""
    found = find_preset(kind, name)
    if found is None:
        raise unknown_name_error(kind, name, preset_names(kind))
    return found


def preset_path(kind: str, name: str) -> Path:
    return _preset_file(kind, resolve_preset(kind, name))


def looks_like_path(value: str) -> bool:
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value or "\\" in value


def _file_or_preset(kind: str, value: str) -> tuple[Path, str]:
    """(file to read, default name): a .yaml/.yml/.json value is a file; a preset name or alias (HF repo ids
    such as meta-llama/Llama-3.1-70B included) is a preset; anything else with a path separator is a file."""
    if not value.endswith((".yaml", ".yml", ".json")):
        found = find_preset(kind, value)
        if found is not None:
            return _preset_file(kind, found), found
    if looks_like_path(value):
        path = Path(value)
        if not path.exists() and not value.endswith((".yaml", ".yml", ".json")):  # e.g. an HF repo id we lack
            raise unknown_name_error(kind, value, preset_names(kind), or_file=True)
        return path, path.stem
    raise unknown_name_error(kind, value, preset_names(kind))


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name or alias, or a user's YAML file in the preset format. A preset named by one of its
    repository ids (``meta-llama/Llama-3.1-70B``) keeps that id as the checkpoint to serve (``hf_repo``)."""
    path, default_name = _file_or_preset("model", name_or_path)
    document = read_data_file(path)
    spec = model_from_mapping(document, origin=str(path), default_name=default_name)
    key = name_or_path.strip().lower()
    named = next((str(a) for a in document.get("aliases") or [] if "/" in key and str(a).lower() == key), None)
    return replace(spec, hf_repo=named) if named else spec


def load_gpu(name_or_path: str):  # -> tfcalc.spec.gpu.GPUSpec
    """A GPU preset by name or alias, or a user's YAML file in the GPU preset format."""
    from tfcalc.spec.gpu import gpu_from_mapping

    path, default_name = _file_or_preset("gpu", name_or_path)
    return gpu_from_mapping(read_data_file(path), origin=str(path), default_name=default_name)


_ENGINE_FILE = re.compile(r"(?P<engine>.+?)-(?P<version>\d[\w.]*)")


def engine_family(preset: str) -> str:
    """The engine a preset file name describes: ``vllm-0.21`` -> ``vllm``, ``gpt-fast`` -> ``gpt-fast``."""
    match = _ENGINE_FILE.fullmatch(preset)
    return match.group("engine") if match else preset


@functools.cache
def _default_engine_section(engine: str, key: str, exclude: str | None = None):  # -> EngineKernels | ...
    """The ``kernels:``, ``scheduler:`` or ``requests:`` block of ``engine``'s default version preset (shared by its
    other versions), if any."""
    from tfcalc.spec.engine import kernels_from_mapping, requests_from_mapping, scheduler_from_mapping

    read = {"kernels": kernels_from_mapping, "scheduler": scheduler_from_mapping,
            "requests": requests_from_mapping}[key]
    for name in preset_names("engine"):
        if name == exclude or engine_family(name) != engine:
            continue
        document = _engine_preset_file_document(name)
        if document.get("default") is True and document.get(key) is not None:
            return read(copy.deepcopy(document[key]), str(_preset_file("engine", name)))
    return None


@functools.cache
def _engine_preset_file_document(name: str) -> dict[str, Any]:
    """An engine preset's file as written (read once; callers copy what they change)."""
    return read_data_file(_preset_file("engine", name))


def engine_document(path: Path, preset: str | None = None, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """An engine file's mapping (``preset``: that engine preset's, read once) with its ``base:`` (another engine
    preset of the same engine, by name) laid under it: the release's changes are all its file holds. A base is never
    the default (``default`` is the file's own)."""
    data = copy.deepcopy(_engine_preset_file_document(preset)) if preset is not None else read_data_file(path)
    return _laid_over_base(data, path, seen)


def _laid_over_base(data: Any, path: Path, seen: tuple[str, ...] = ()) -> Any:
    """An engine mapping with the preset its ``base:`` names laid under it (``engine_document``)."""
    from tfcalc.spec.engine import merged_mapping

    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data.pop("base")
    names = preset_names("engine")
    if not isinstance(base, str) or base not in names:
        raise SpecError(f"{path}: field 'base' must name an engine preset ({', '.join(names)}), got {base!r}")
    if base in seen:
        raise SpecError(f"{path}: engine presets base themselves on each other ({' -> '.join((*seen, base))})")
    under = engine_document(_preset_file("engine", base), base, (*seen, base))
    if under.get("name") != data.get("name", under.get("name")):
        raise SpecError(f"{path}: field 'base' must name a preset of the same engine ({under.get('name')} is not "
                        f"{data.get('name')})")
    under.pop("default", None)
    return merged_mapping(under, data)


def _engine_from_file(path: Path, default_name: str, preset: str | None = None):  # -> EngineSpec
    """One engine file; without a ``kernels:``, ``scheduler:`` or ``requests:`` block it runs its kernels, schedules
    its steps and serves its requests as its engine's default version does."""
    from tfcalc.spec.engine import engine_from_mapping

    data = engine_document(path, preset)
    fallback = data.pop("extensible_off", None) if isinstance(data, dict) else None
    inherited = {"kernels": None, "scheduler": None, "requests": None}
    for key in inherited:
        if data.get(key) is None and isinstance(data.get("name"), str):
            inherited[key] = _default_engine_section(data["name"], key, exclude=preset)
    engine = engine_from_mapping(data, origin=str(path), default_name=default_name,
                                 inherited_kernels=inherited["kernels"], inherited_scheduler=inherited["scheduler"],
                                 inherited_requests=inherited["requests"])
    if fallback is None:
        return engine
    off = _extensible_off_mapping(fallback, data, path)
    return replace(engine, extensible_off=engine_from_mapping(
        off, origin=f"{path} (extensible_off)", default_name=default_name, inherited_kernels=inherited["kernels"],
        inherited_scheduler=inherited["scheduler"], inherited_requests=inherited["requests"]))


def _extensible_off_mapping(section: Any, data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``extensible_off``: {base: the preset whose sizing the release falls back to without its extensible KV cache,
    and what the release changes beside} -> that accounting's mapping, under the release's own version and name."""
    names = preset_names("engine")
    if not isinstance(section, dict) or section.get("base") not in names:
        raise SpecError(f"{path}: field 'extensible_off' must be a mapping whose 'base' names an engine preset "
                        f"({', '.join(names)})")
    release = {key: data[key] for key in ("name", "version", "releases", "sources") if key in data}
    return _laid_over_base({**section, **release}, path)


def engine_choices() -> list[str]:
    """What ``--engine`` accepts by name: ideal, every engine, every preset (``vllm-0.17``)."""
    names = preset_names("engine")
    return ["ideal", *sorted({engine_family(n) for n in names} | set(names))]


def load_engine(name_or_path: str):  # -> tfcalc.spec.engine.EngineSpec
    """An engine version: ``vllm`` (its default version), ``vllm@0.19.1`` (the entry whose releases cover it),
    a preset name (``vllm-0.17``, ``gpt-fast``), or a YAML file in the engine preset format. ``ideal`` (no engine)
    is the callers' to handle (``tfcalc.cli.common.engine_list``): it is not an EngineSpec."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path)
        return _engine_from_file(path, path.stem)
    names = preset_names("engine")
    if name_or_path in names:
        return _engine_from_file(_preset_file("engine", name_or_path), name_or_path, name_or_path)
    engine, _, version = name_or_path.partition("@")
    family = [n for n in names if engine_family(n) == engine]
    if not family:
        families = ["ideal", *sorted({engine_family(n) for n in names})]
        hints = suggest(name_or_path, engine_choices())
        raise UsageError(f"unknown engine '{name_or_path}' (choose {', '.join(families)}, NAME@VERSION, a preset "
                         "such as vllm-0.17, or an engine YAML file)" + (f"; did you mean {', '.join(hints)}?"
                                                                          if hints else ""))
    # chosen by the files' own ``default`` and ``releases`` (never inherited), so that one preset is built
    documents = {n: _engine_preset_file_document(n) for n in family}
    if _ and not version.strip():
        raise UsageError(f"--engine '{name_or_path}': name a version after the @ ({engine}@0.19), or drop the @")
    if not version:
        chosen = next((n for n in family if isinstance(documents[n], dict) and documents[n].get("default") is True),
                      family[-1])
        return _engine_from_file(_preset_file("engine", chosen), chosen, chosen)
    wanted = _version_tuple(version, name_or_path)
    releases = {n: str(d.get("releases", "")) if isinstance(d, dict) else "" for n, d in documents.items()}
    for n in family:
        if not releases[n]:
            continue
        low, dash, high = releases[n].partition("-")
        if low.endswith("+"):   # "0.34+": that release and every later one
            low, high = low[:-1], ""
        elif not dash:          # "0.32": that release line alone
            high = low
        top = _version_tuple(high, releases[n]) if high else None
        if _version_tuple(low, releases[n])[:len(wanted)] <= wanted and (top is None or wanted[:len(top)] <= top):
            return _engine_from_file(_preset_file("engine", n), n, n)
    known = ", ".join(f"{engine}@{releases[n]}" for n in family if releases[n])
    if not known:
        raise UsageError(f"{engine} has no versions to choose from: use --engine {engine}")
    raise UsageError(f"no {engine} engine preset covers version {version} (known: {known})")


def _version_tuple(text: str, origin: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        raise UsageError(f"bad version '{text}' in '{origin}': use numbers like 0.19 or 0.19.1") from None


def load_preset_document(kind: str, name: str) -> dict[str, Any]:
    """The raw preset mapping (with sources and published figures), for ``presets show`` and tests; an engine file's
    with its base laid under it (``engine_document``)."""
    if kind == "engine":
        preset = resolve_preset(kind, name)
        return engine_document(_preset_file(kind, preset), preset)
    return read_data_file(preset_path(kind, name))


# --- mapping -> ModelSpec ------------------------------------------------------------------------

_MODEL_FIELDS = {f.name for f in fields(ModelSpec)}
_MOE_FIELDS = {f.name for f in fields(MoESpec)}
_MLA_FIELDS = {f.name for f in fields(MLASpec)}
_FULL_ATTENTION_FIELDS = {f.name for f in fields(FullAttentionSpec)}
_ROPE_FIELDS = {f.name for f in fields(RopeScaling)}
_ENCODER_FIELDS = {f.name for f in fields(EncoderSpec)}
_LINEAR_FIELDS = {f.name for f in fields(LinearAttentionSpec)}
_INDEXER_FIELDS = {f.name for f in fields(SparseIndexerSpec)}
_COMPRESSED_FIELDS = {f.name for f in fields(CompressedAttentionSpec)}


def _check_keys(data: dict[Any, Any], allowed: set[str], origin: str, prefix: str = "") -> None:
    unknown = sorted(key_text(key) for key in data if key not in allowed)
    if unknown:
        hints = suggest(unknown[0], sorted(allowed), limit=1)
        hint = f" (did you mean '{prefix}{hints[0]}'?)" if hints else ""
        raise SpecError(f"{origin}: unknown field '{prefix}{unknown[0]}'{hint}")


def _mapping(value: Any, origin: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{origin}: field '{key}' must be a mapping")
    return dict(value)


def _layer_list(value: Any, num_layers: int, key: str) -> tuple[int, ...]:
    """``all``, ``even``, ``odd``, ``none`` or an explicit list of layer indices (checked by ModelSpec)."""
    patterns = {
        "all": range(num_layers),
        "even": range(0, num_layers, 2),
        "odd": range(1, num_layers, 2),
        "none": range(0),
    }
    if isinstance(value, str) and value in patterns:
        return tuple(patterns[value])
    if isinstance(value, list) and len(value) <= num_layers:
        return tuple(check_int(key, v, (0, num_layers - 1)) for v in value)
    if isinstance(value, list):
        raise SpecError(f"field '{key}' lists {len(value)} layers; the model has {num_layers}")
    raise SpecError(f"field '{key}' must be all, even, odd, none or a list of layer indices")


def _width_list(value: Any, num_layers: int, key: str) -> tuple[int, ...]:
    """One MLP width per layer (0 on a layer without an FFN; ModelSpec checks each against intermediate_size)."""
    if not isinstance(value, list) or len(value) != num_layers:
        raise SpecError(f"field '{key}' must be a list of one MLP width per layer ({num_layers}), got "
                        f"{len(value) if isinstance(value, list) else type(value).__name__}")
    return tuple(check_int(f"{key}[{i}]", w, (0, 1 << 24)) for i, w in enumerate(value))


def _hybrid_pattern(data: dict[str, Any], num_layers: int) -> None:
    """Nemotron-H's ``hybrid_override_pattern`` (one of M * - E per layer: a Mamba-2, attention without RoPE, MLP or
    MoE block) spread into the layer lists it stands for: Mamba-2 layers, layers without an FFN or a mixer, NoPE
    layers and the MoE's dense layers."""
    pattern = data.pop("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != num_layers or set(pattern) - set(HYBRID_BLOCKS):
        raise SpecError(f"field 'hybrid_override_pattern' must give one of {' '.join(HYBRID_BLOCKS)} for each of the "
                        f"{num_layers} layers")
    where = {block: tuple(i for i, x in enumerate(pattern) if HYBRID_BLOCKS[x] == block)
             for block in HYBRID_BLOCKS.values()}
    data["ffn_free_layers"] = tuple(sorted(where["mamba"] + where["attention"]))
    data["mixer_free_layers"] = tuple(sorted(where["mlp"] + where["moe"]))
    data["nope_layers"] = where["attention"]
    if isinstance(data.get("linear_attention"), dict):
        data["linear_attention"] = {**data["linear_attention"], "layers": list(where["mamba"])}
    if isinstance(data.get("moe"), dict):
        data["moe"] = {**data["moe"], "dense_layers": [i for i in range(num_layers) if i not in where["moe"]]}


def _check_document_keys(data: dict[str, Any]) -> None:
    """The provenance keys that are shown to people have a type too."""
    if "display_name" in data:
        check_str("display_name", data["display_name"], MAX_NAME_CHARS)
    aliases = data.get("aliases")
    if aliases is not None and (not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases)):
        raise SpecError("field 'aliases' must be a list of names")


def model_from_mapping(data: dict[str, Any], origin: str, default_name: str) -> ModelSpec:
    """Validate a preset-format mapping and build the ModelSpec; errors name the file and the field.

    Every value is checked by type and range (``tfcalc.spec.model.check_fields``) before any work that grows
    with it: the layer count is checked before layer patterns are expanded.
    """
    data = dict(data)
    _check_keys(data, _MODEL_FIELDS | _DOC_KEYS | {"moe", "mla", "rope_scaling", "sliding_window_layers",
                                                   "nope_layers", "hybrid_override_pattern"}, origin)
    try:
        _check_document_keys(data)
        for key in _DOC_KEYS:
            data.pop(key, None)
        if data.get("num_layers") is None:
            raise SpecError("missing required field 'num_layers'")
        num_layers = check_int("num_layers", data["num_layers"])
        if "sliding_window_layers" in data:
            data["sliding_window_layers"] = _layer_list(data["sliding_window_layers"], num_layers,
                                                        "sliding_window_layers")
        elif data.get("sliding_window") is not None:
            data["sliding_window_layers"] = tuple(range(num_layers))
        if "nope_layers" in data:
            data["nope_layers"] = _layer_list(data["nope_layers"], num_layers, "nope_layers")
        for key in ("ffn_free_layers", "mixer_free_layers"):
            if key in data:
                data[key] = _layer_list(data[key], num_layers, key)
        if "hybrid_override_pattern" in data:
            _hybrid_pattern(data, num_layers)
        if "layer_intermediate_sizes" in data:
            data["layer_intermediate_sizes"] = _width_list(data["layer_intermediate_sizes"], num_layers,
                                                           "layer_intermediate_sizes")
        data.setdefault("name", default_name)
        return _build_model(data, num_layers, origin)
    except TypeError as exc:
        message = str(exc)
        prefix = {"MoESpec": "moe.", "MLASpec": "mla.", "RopeScaling": "rope_scaling.",
                  "EncoderSpec": "encoder.", "LinearAttentionSpec": "linear_attention.",
                  "FullAttentionSpec": "full_attention.",
                  "SparseIndexerSpec": "sparse_indexer.",
                  "CompressedAttentionSpec": "compressed_attention."}.get(message.split(".")[0], "")
        match = re.search(r"arguments?: '(\w+)'", message)
        if match:
            raise SpecError(f"{origin}: missing required field '{prefix}{match.group(1)}'") from None
        raise SpecError(f"{origin}: invalid value: {message}") from None
    except SpecError as exc:
        message = str(exc)
        raise SpecError(message if message.startswith(origin) else f"{origin}: {message}") from None


def _build_model(data: dict[str, Any], num_layers: int, origin: str) -> ModelSpec:
    if data.get("moe") is not None:
        moe = _mapping(data["moe"], origin, "moe")
        _check_keys(moe, _MOE_FIELDS | {"first_k_dense"}, origin, "moe.")
        if "first_k_dense" in moe:
            first = check_int("moe.first_k_dense", moe.pop("first_k_dense"), (0, num_layers))
            moe["dense_layers"] = tuple(range(first))
        elif "dense_layers" in moe:
            moe["dense_layers"] = _layer_list(moe["dense_layers"], num_layers, "moe.dense_layers")
        data["moe"] = MoESpec(**moe)
    if data.get("mla") is not None:
        mla = _mapping(data["mla"], origin, "mla")
        _check_keys(mla, _MLA_FIELDS, origin, "mla.")
        data["mla"] = MLASpec(**{"q_lora_rank": None, **mla})
    if data.get("full_attention") is not None:
        full = _mapping(data["full_attention"], origin, "full_attention")
        _check_keys(full, _FULL_ATTENTION_FIELDS, origin, "full_attention.")
        data["full_attention"] = FullAttentionSpec(**full)
    if data.get("encoder") is not None:
        encoder = _mapping(data["encoder"], origin, "encoder")
        _check_keys(encoder, _ENCODER_FIELDS, origin, "encoder.")
        data["encoder"] = EncoderSpec(**encoder)
    if data.get("linear_attention") is not None:
        linear = _mapping(data["linear_attention"], origin, "linear_attention")
        _check_keys(linear, _LINEAR_FIELDS | {"full_attention_interval"}, origin, "linear_attention.")
        if "full_attention_interval" in linear:  # Qwen3-Next's pattern: every N-th layer keeps softmax attention
            every = check_int("linear_attention.full_attention_interval", linear.pop("full_attention_interval"),
                              (1, num_layers))
            linear["layers"] = tuple(i for i in range(num_layers) if (i + 1) % every)
        elif "layers" in linear:
            linear["layers"] = _layer_list(linear["layers"], num_layers, "linear_attention.layers")
        data["linear_attention"] = LinearAttentionSpec(**linear)
    if data.get("sparse_indexer") is not None:
        indexer = _mapping(data["sparse_indexer"], origin, "sparse_indexer")
        _check_keys(indexer, _INDEXER_FIELDS, origin, "sparse_indexer.")
        indexer["layers"] = _layer_list(indexer.get("layers", "all"), num_layers, "sparse_indexer.layers")
        data["sparse_indexer"] = SparseIndexerSpec(**indexer)
    if data.get("compressed_attention") is not None:
        compressed = _mapping(data["compressed_attention"], origin, "compressed_attention")
        _check_keys(compressed, _COMPRESSED_FIELDS, origin, "compressed_attention.")
        for key in ("csa_layers", "hca_layers"):
            if key in compressed:
                compressed[key] = _layer_list(compressed[key], num_layers, f"compressed_attention.{key}")
        data["compressed_attention"] = CompressedAttentionSpec(**compressed)
    if data.get("quantized_weight_exceptions") is not None:
        data["quantized_weight_exceptions"] = _weight_exceptions(data["quantized_weight_exceptions"], num_layers,
                                                                 origin)
    if data.get("rope_scaling") is not None:
        rope = _mapping(data["rope_scaling"], origin, "rope_scaling")
        _check_keys(rope, _ROPE_FIELDS, origin, "rope_scaling.")
        data["rope_scaling"] = RopeScaling(**rope)
    return ModelSpec(**data)


def _weight_exceptions(value: Any, num_layers: int, origin: str) -> tuple[WeightException, ...]:
    """``[{layers: [0, 125] | {first: N, last: M} | all/even/odd, components: [mlp], dtype: bf16,
    formats: [fp8], modules: [down_proj]}, ...]`` (formats: the chosen weight formats it applies to; any quantized one
    if omitted; modules: some modules of the one component named, ``LAYER_MODULES``; all if omitted)."""
    key = "quantized_weight_exceptions"
    if not isinstance(value, list):
        raise SpecError(f"{origin}: field '{key}' must be a list of {{layers, components, dtype}} mappings")
    result = []
    for item in value:
        if not isinstance(item, dict):
            raise SpecError(f"{origin}: each '{key}' entry must be a mapping with layers, components and dtype")
        _check_keys(item, {"layers", "components", "dtype", "formats", "modules", "source"}, origin, f"{key}.")
        layers = item.get("layers")
        if isinstance(layers, dict):
            _check_keys(layers, {"first", "last"}, origin, f"{key}.layers.")
            first, last = (check_int(f"{key}.layers.{k}", layers.get(k, 0), (0, num_layers))
                           for k in ("first", "last"))
            indices = tuple(sorted({*range(min(first, num_layers)), *range(max(num_layers - last, 0), num_layers)}))
        else:
            indices = _layer_list(layers, num_layers, f"{key}.layers")
        components, formats, modules = item.get("components"), item.get("formats", []), item.get("modules", [])
        for name, names in (("components", components), ("formats", formats), ("modules", modules)):
            if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
                raise SpecError(f"{origin}: field '{key}.{name}' must be a list of names")
        result.append(WeightException(layers=indices, components=tuple(components), formats=tuple(formats),
                                      modules=tuple(modules),
                                      dtype=check_str(f"{key}.dtype", item.get("dtype", "bf16"))))
    return tuple(result)
