"""Check Kubernetes objects against a CustomResourceDefinition's OpenAPI v3 schema.

A CRD's ``openAPIV3Schema`` is almost JSON Schema (draft 4), plus Kubernetes extensions
that ``jsonschema`` does not know. :func:`to_json_schema` rewrites one into plain JSON
Schema the way the API server reads it when ``kubectl apply`` validates strictly (its
default):

- an object schema that lists ``properties`` rejects any other field
  (``additionalProperties: false``), unless it has ``additionalProperties`` of its own or
  ``x-kubernetes-preserve-unknown-fields: true``; an object schema without ``properties``
  (such as an embedded ``metadata``) stays open;
- ``x-kubernetes-int-or-string: true`` accepts an integer or a string;
- ``nullable: true`` also accepts null;
- ``x-kubernetes-list-type: set`` needs unique items, and ``x-kubernetes-list-type: map``
  needs items unique by their ``x-kubernetes-list-map-keys`` (a key's schema default
  stands in when an item leaves it out, as the server's defaulting does);
- ``format: int32`` and ``int64`` bound integers to their ranges.

Not checked: the CEL rules of ``x-kubernetes-validations`` (the operator's own checks
need a live cluster), and defaults are not filled in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

#: Kubernetes resource quantities ("500m", "28Gi", "1e3"), the pattern the CRDs use.
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_UNIQUE_BY = "x-unique-by"  # the rewritten form of x-kubernetes-list-map-keys
_INT_RANGES = {"int32": 2**31, "int64": 2**63}


def load_crd(path: Path) -> dict[str, Any]:
    """Read one CustomResourceDefinition from a YAML file.

    Parameters
    ----------
    path : Path
        A file holding exactly one ``apiextensions.k8s.io/v1`` CustomResourceDefinition.

    Returns
    -------
    dict
        The parsed CRD.

    Raises
    ------
    ValueError
        If the file holds another kind of object.
    """
    with open(path, encoding="utf-8") as f:
        crd = yaml.load(f, Loader=_LOADER)
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: not a CustomResourceDefinition (kind {crd.get('kind')!r})")
    return crd


def to_json_schema(node: Any) -> Any:
    """Rewrite a CRD's OpenAPI v3 schema (or a part of it) as plain JSON Schema.

    Parameters
    ----------
    node : dict or list or scalar
        An ``openAPIV3Schema`` or any schema inside it.

    Returns
    -------
    dict or list or scalar
        A new schema for a draft 4 validator built by :func:`validator_for`; the input
        is not changed. The rules are listed in this module's docstring.
    """
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "anyOf", "allOf", "oneOf"):
            out[key] = to_json_schema(value)
        elif key == "x-kubernetes-list-type":
            if value == "set":
                out["uniqueItems"] = True
        elif key == "x-kubernetes-list-map-keys":
            out[_UNIQUE_BY] = list(value)
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _unique_by(validator, keys, instance, schema) -> Iterator[jsonschema.ValidationError]:
    """Keyword check: list items must differ in the tuple of their ``keys``."""
    if not validator.is_type(instance, "array"):
        return
    item_props = schema.get("items", {}).get("properties", {})
    seen: dict[tuple, int] = {}
    for index, item in enumerate(instance):
        if not isinstance(item, dict):
            continue
        key = tuple(item.get(k, item_props.get(k, {}).get("default")) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(
                f"items {seen[key]} and {index} share the key {dict(zip(keys, key))}; "
                f"items of this list must differ in {', '.join(keys)}"
            )
        seen.setdefault(key, index)


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, bound in _INT_RANGES.items():
        checker.checks(name)(
            lambda value, bound=bound: (
                not isinstance(value, int) or isinstance(value, bool) or -bound <= value < bound
            )
        )
    return checker


_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {_UNIQUE_BY: _unique_by})


def validator_for(crd: dict[str, Any], version: str) -> jsonschema.protocols.Validator:
    """A validator for whole objects of one served version of a CRD.

    Parameters
    ----------
    crd : dict
        A CustomResourceDefinition, as from :func:`load_crd`.
    version : str
        The version name, for example ``"v1"``.

    Returns
    -------
    jsonschema.protocols.Validator
        Validates an object (``apiVersion``, ``kind``, ``metadata``, ``spec``) against the
        rewritten ``openAPIV3Schema`` of that version.

    Raises
    ------
    KeyError
        If the CRD does not serve ``version``.
    """
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version and entry.get("served", True):
            schema = to_json_schema(entry["schema"]["openAPIV3Schema"])
            return _Validator(schema, format_checker=_format_checker())
    raise KeyError(f"{crd['metadata']['name']} does not serve version {version!r}")


def errors(validator: jsonschema.protocols.Validator, obj: Any) -> list[str]:
    """Every schema violation in ``obj``, as ``"path: message"`` lines.

    Parameters
    ----------
    validator : jsonschema.protocols.Validator
        From :func:`validator_for` (or any ``jsonschema`` validator).
    obj : Any
        The object to check.

    Returns
    -------
    list of str
        Empty when ``obj`` is valid; otherwise one line per violation, the path written
        with dots and list indices (``spec.workerGroupSpecs[0].maxReplicas``).
    """
    lines = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        lines.append(f"{path.lstrip('.') or '<root>'}: {err.message}")
    return lines
