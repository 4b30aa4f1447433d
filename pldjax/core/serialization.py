"""Saving and restoring filter, odometer and accountant states, exactly and atomically.

A state is a pytree of arrays. :func:`save` writes its leaves with a header naming the format
version, the filter kind and its parameters; :func:`load` checks all three against the filter it
is given and rebuilds the state on that filter's own tree structure, so a state can only be
restored into the filter that made it. Two formats, chosen by the file suffix:

* ``.npz``: NumPy's archive, leaves stored bit for bit;
* ``.json``: leaves as hexadecimal floats (``float.hex``), exact and readable.

States store their 64-bit values as exact uint32 bit pairs (:func:`pldjax.core.precision.pack`), so a
restored state is bit-identical whatever the caller's ``jax_enable_x64``. Files of version 1
(float64 / int64 leaves) are still read: their leaves are packed on loading.

Writes go to a temporary file in the same directory, then replace the target in one step: a crash
or an error while saving leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import jax
import numpy as np

from pldjax.core.namespace import public_dir
from pldjax.core.pld import PLD
from pldjax.core.precision import pack

FORMAT = "pldjax-state"
VERSION = 2
#: Older versions still read (their 64-bit leaves are packed on loading).
_READABLE = (1, 2)


def _header(kind: str, params: dict) -> dict:
    return {"format": FORMAT, "version": VERSION, "kind": kind,
            "params": json.loads(json.dumps(params, default=_plain))}


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store parameter {value!r}")


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _encode_json(leaf: np.ndarray) -> dict:
    flat = leaf.reshape(-1)
    if leaf.dtype.kind == "f":
        values = [float(v).hex() for v in flat]
    else:
        values = [int(v) for v in flat]
    return {"dtype": leaf.dtype.str, "shape": list(leaf.shape), "values": values}


def _decode_json(entry: dict) -> np.ndarray:
    dtype = np.dtype(entry["dtype"])
    if dtype.kind == "f":
        values = [float.fromhex(v) for v in entry["values"]]
    else:
        values = entry["values"]
    return np.asarray(values, dtype).reshape(entry["shape"])


def save(path, state, *, kind: str, params: dict) -> None:
    """Write ``state`` (a pytree of arrays) for the filter or accountant ``kind``/``params``.

    Args:
      path: the file (str or path-like), ending in ``.npz`` (NumPy's archive) or ``.json``
        (hexadecimal floats); missing parent directories are created, and an existing file is
        replaced in one step (atomically).
      state: a pytree of arrays (typed PRNG keys are stored as their key data).
      kind: the name of the kind of object the state belongs to (a filter, odometer or
        accountant), written in the header.
      params: that object's parameters, written in the header for :func:`load` to check
        (JSON-serializable values; NumPy arrays and scalars are converted).

    Returns:
      None.
    """
    path = Path(path)
    leaves = [np.asarray(_plain_leaf(leaf)) for leaf in jax.tree_util.tree_leaves(state)]
    header = _header(kind, params)
    if path.suffix == ".json":
        text = json.dumps({**header, "leaves": [_encode_json(leaf) for leaf in leaves]})
        _atomic_write(path, lambda stream: stream.write(text.encode()))
    elif path.suffix == ".npz":
        arrays = {f"leaf_{i}": leaf for i, leaf in enumerate(leaves)}
        _atomic_write(path, lambda stream: np.savez(stream, header=json.dumps(header), **arrays))
    else:
        raise ValueError(f"path must end in .npz or .json, got {path.name!r}")


def _read(path: Path) -> tuple[dict, list]:
    """(header, leaves) of a saved state; a damaged file is a ValueError naming it."""
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            header = {k: data.get(k) for k in ("format", "version", "kind", "params")}
            return header, [_decode_json(entry) for entry in data["leaves"]]
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(str(archive["header"]))
            count = len([k for k in archive.files if k.startswith("leaf_")])
            return header, [archive[f"leaf_{i}"] for i in range(count)]
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: not a readable {FORMAT} file ({type(error).__name__}: "
                         f"{error})") from None


def load(path, template, *, kind: str, params: dict, batched: bool = False):
    """Read a state saved by :func:`save`, checked against ``kind``/``params`` and rebuilt on the
    tree structure (and leaf shapes and dtypes) of ``template``. ``batched``: the leaves may also
    carry leading batch axes (a vmapped state), the same for every leaf.

    Args:
      path: a file written by :func:`save`, ending in ``.npz`` or ``.json``.
      template: a state of the expected tree structure, leaf shapes and dtypes (its values are
        not read).
      kind: the kind the file must have been saved for.
      params: the parameters the file must have been saved with (compared after the same JSON
        conversion as :func:`save` makes).
      batched: False (default): every leaf has the template's shape; True: the leaves may carry
        the same leading batch axes.

    Returns:
      A pytree of the template's structure whose leaves are JAX arrays (typed PRNG keys where
      the template has them) holding the saved values. A file that does not match
      (format, version, kind, parameters, number, shapes or dtypes of the arrays) or cannot be
      read raises a ValueError.
    """
    path = Path(path)
    if path.suffix not in (".json", ".npz"):
        raise ValueError(f"path must end in .npz or .json, got {path.name!r}")
    header, leaves = _read(path)
    if header.get("format") != FORMAT or header.get("version") not in _READABLE:
        raise ValueError(f"{path}: not a {FORMAT} file of version {VERSION} "
                         f"(format {header.get('format')!r}, version {header.get('version')!r})")
    expected = _header(kind, params)
    if header["kind"] != kind or header["params"] != expected["params"]:
        raise ValueError(f"{path}: saved for {header['kind']} {header['params']}, not for "
                         f"{kind} {expected['params']}")
    template_leaves, treedef = jax.tree_util.tree_flatten(template)
    if len(leaves) != len(template_leaves):
        raise ValueError(f"{path}: {len(leaves)} arrays, the state has {len(template_leaves)}")
    restored, batch = [], None
    for got, like in zip(leaves, template_leaves, strict=True):
        want = np.asarray(_plain_leaf(like))
        if (header["version"] == 1 and got.dtype in (np.float64, np.int64)
                and want.dtype == np.uint32 and want.shape[-1:] == (2,)):
            with jax.enable_x64(True):
                got = np.asarray(pack(got))
        axes = got.ndim - want.ndim if batched else 0
        shape = want.shape if batch is None or axes < 0 else batch + want.shape
        if axes < 0 or got.shape != got.shape[:axes] + want.shape or got.dtype != want.dtype:
            raise ValueError(f"{path}: array of shape {got.shape} {got.dtype}, the state needs "
                             f"{shape} {want.dtype}")
        if batch is not None and got.shape[:axes] != batch:
            raise ValueError(f"{path}: arrays of batch shapes {batch} and {got.shape[:axes]}, "
                             f"a batched state has one")
        batch = got.shape[:axes]
        restored.append(_like(got, like))
    return jax.tree_util.tree_unflatten(treedef, restored)


def _is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _plain_leaf(leaf):
    """Typed PRNG keys (noise keys in optimizer states) are stored as their key data."""
    return jax.random.key_data(leaf) if _is_key(leaf) else leaf


def _like(array: np.ndarray, template_leaf):
    if _is_key(template_leaf):
        return jax.random.wrap_key_data(array, impl=jax.random.key_impl(template_leaf))
    return jax.device_put(array)  # (jnp.asarray compiles a program per shape)


def save_filter_state(path, filter_, state) -> None:
    """Save a filter's state (see :func:`save`).

    Args:
      path: the file, ending in ``.npz`` or ``.json`` (written atomically, as by :func:`save`).
      filter_: the filter the state belongs to (its ``kind`` and ``params`` go in the header).
      state: the filter's state, batched (by vmap) or not.

    Returns:
      None.
    """
    save(path, state, kind=filter_.kind, params=filter_.params)


def load_filter_state(path, filter_):
    """Restore a state saved by :func:`save_filter_state` for this very filter, batched (by
    vmap) or not. A state that no sequence of spends reaches (a damaged or edited file) is a
    ValueError: one whose remaining budget is NaN, negative or above a fresh filter's (a PLD
    budget's masses NaN or negative), in any batch element.

    Args:
      path: a file written by :func:`save_filter_state` (``.npz`` or ``.json``).
      filter_: the filter that saved it (the same kind and parameters).

    Returns:
      The filter's state, a pytree of JAX arrays, with the batch axes (in front) it was saved with,
      if any.
    """
    state = load(path, filter_.init(), kind=filter_.kind, params=filter_.params, batched=True)
    left, fresh = filter_.remaining(state), filter_.remaining(filter_.init())
    if isinstance(left, PLD):
        pairs = [(np.asarray(a, np.float64), None) for direction in left.directions()
                 for a in (direction.probs, direction.inf_mass)]
    else:
        pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
                 for a, b in zip(jax.tree_util.tree_leaves(left),
                                 jax.tree_util.tree_leaves(fresh), strict=True)]
    for value, bound in pairs:
        if np.any(np.isnan(value) | (value < 0)) or (bound is not None and np.any(value > bound)):
            raise ValueError(f"{path}: the state leaves a budget no spend reaches from "
                             f"{filter_.kind} {filter_.params} ({left}); the file is damaged")
    return state


def save_odometer_state(path, odometer, state) -> None:
    """Save an odometer's state (see :func:`save`).

    Args:
      path: the file, ending in ``.npz`` or ``.json`` (written atomically, as by :func:`save`).
      odometer: the odometer the state belongs to (its ``kind`` and ``params`` go in the
        header).
      state: the odometer's state, batched (by vmap) or not.

    Returns:
      None.
    """
    save(path, state, kind=odometer.kind, params=odometer.params)


def load_odometer_state(path, odometer):
    """Restore a state saved by :func:`save_odometer_state` for this very odometer, batched (by
    vmap) or not. A state that no sequence of steps reaches (a damaged or edited file: a NaN or
    negative sum, alive flags that do not match the rungs' budgets, ...) is a ValueError saying
    what is wrong (``odometer.state_problem``).

    Args:
      path: a file written by :func:`save_odometer_state` (``.npz`` or ``.json``).
      odometer: the odometer that saved it (the same kind and parameters).

    Returns:
      The odometer's state, a pytree of JAX arrays, with the batch axes (in front) it was saved
      with, if any.
    """
    state = load(path, odometer.init(), kind=odometer.kind, params=odometer.params, batched=True)
    problem = odometer.state_problem(state)
    if problem is not None:
        raise ValueError(f"{path}: no sequence of steps of {odometer.kind} {odometer.params} "
                         f"reaches this state ({problem}); the file is damaged")
    return state


__all__ = ["FORMAT", "VERSION", "load", "load_filter_state", "load_odometer_state", "save",
           "save_filter_state", "save_odometer_state"]
__dir__ = public_dir(__all__)
