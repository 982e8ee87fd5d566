"""KVzip's scores without its pass: each token's reconstruction score predicted from its hidden
state (eviction.policy predicted_kvzip; KVzap, arXiv 2601.07891, kvpress's ``KVzapPress``).

KVzip scores a cached token by the most attention it gets while the model repeats the context:
a second prefill. Those scores are largely a function of the token's own hidden state, so a
small map per layer predicts them: here a linear one, from the layer's input hidden state
(RMS-normalised, without the norm's weights, plus a constant) to the log of the score of each
kv head, fitted once per model by ridge regression to the engine's own kvzip pass on dev-split
text (``python -m mnn_h2o.tools.fit_scorer``). The engine applies it to every token as it
enters the cache (prompt chunks and decode tokens), and the cache ranks tokens by it exactly as
it ranks kvzip's peaks (docs/eviction.md "Predicted scores").

The file (``predicted_kvzip.npz`` beside the export; where there is none, the one fitted for the
same GGUF that ships in ``mnn_h2o/scorers/`` under the first 16 hex digits of its sha256, as
for the named models) holds, by name:

    weights   float32 [n_layers, hidden + 1, n_kv_heads]  log-score = [x, 1] @ weights[layer]
    layers    int32 [2]                                   the evicting layers [start, end) fitted
    meta      a JSON string: the model's source_sha256, its shapes, the fit's data, loss and time,
              and ``query_peaks`` (true: the prompt's own queries add their peaks to the
              predictions, KvCache.set_query_peaks; a choice made per model on the dev split,
              docs/eviction.md "Predicted scores"; absent: false), and ``prompt_end_share`` (the
              eviction.prompt_end_share this map was chosen with on the dev split, what the
              config's -1 resolves to; absent: 0)

A file whose source_sha256 or shapes are not the export's is refused (ScorerFileError).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import ModelFileError

FILE_NAME = "predicted_kvzip.npz"
FORMAT = 1
# Scores below this carry no ranking information the budget uses (kvzip's peaks of the tokens it
# evicts at 6x are ~1e-3); the log-targets are clipped here so the fit does not spend itself on
# the noise of near-zero peaks.
MIN_SCORE = 1e-6
_EPS = 1e-6


class ScorerFileError(ModelFileError):
    """A missing, corrupt or foreign predicted_kvzip.npz."""


def features(h: np.ndarray) -> np.ndarray:
    """[n, hidden + 1] float32: each row of h RMS-normalised (no weights), then a constant 1. The
    normalisation makes the map independent of the residual stream's scale, which grows layer
    by layer and token by token."""
    h = np.asarray(h, np.float32).reshape(-1, h.shape[-1])
    x = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + _EPS)
    return np.concatenate([x, np.ones((len(x), 1), np.float32)], axis=1)


def solve_ridge(gram: np.ndarray, rhs: np.ndarray, n: int, lam: float) -> np.ndarray:
    """The ridge solution from the normal equations of n rows (gram = x^T x, rhs = x^T y, the
    constant feature last): argmin_W |x W - y|^2 + lam * n * |W without its last row|^2 (the
    constant's row is not shrunk), in float64."""
    g = np.array(gram, np.float64)
    reg = np.full(g.shape[0], lam * n)
    reg[-1] = 0.0
    g[np.diag_indices_from(g)] += reg
    return np.linalg.solve(g, np.asarray(rhs, np.float64))


def fit_ridge(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """solve_ridge on rows x [n, d] (the constant last) and targets y [n, k]: W [d, k]."""
    x = np.asarray(x, np.float64)
    return solve_ridge(x.T @ x, x.T @ np.asarray(y, np.float64), len(x), lam)


def log_targets(scores: np.ndarray) -> np.ndarray:
    """kvzip's peaks as the fit's targets: log, clipped at MIN_SCORE."""
    return np.log(np.maximum(np.asarray(scores, np.float64), MIN_SCORE))


@dataclass
class TokenScorer:
    weights: np.ndarray          # float32 [n_layers, hidden + 1, n_kv_heads]
    layers: tuple                # (start, end) fitted
    meta: dict

    @property
    def query_peaks(self) -> bool:
        """Whether the cache adds the prompt chunks' own query peaks to this map's predictions."""
        return bool(self.meta.get("query_peaks", False))

    @property
    def prompt_end_share(self) -> float:
        """The eviction.prompt_end_share this map runs with where the config leaves it to the model."""
        return float(self.meta.get("prompt_end_share", 0.0))

    def scores(self, layer: int, h: np.ndarray) -> np.ndarray:
        """Predicted kvzip scores of h's rows at ``layer``: float32 [n_kv_heads, n] in (0, 1]."""
        logit = features(h) @ self.weights[layer]
        return np.exp(np.minimum(logit, 0.0)).T.astype(np.float32, copy=False)

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            np.savez(f, weights=self.weights.astype(np.float32), layers=np.asarray(self.layers, np.int32),
                     meta=np.asarray(json.dumps(dict(self.meta, format=FORMAT))))
        os.replace(tmp, path)  # never a half-written file under the name the engine reads

    @classmethod
    def load(cls, path: str, source_sha256: str, n_layers: int, hidden: int, n_kv_heads: int) -> "TokenScorer":
        """The scorer of an export, checked against it (ScorerFileError naming what differs)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                weights = np.array(z["weights"], np.float32)
                layers = tuple(int(v) for v in z["layers"])
                meta = json.loads(str(z["meta"]))
        except FileNotFoundError:
            raise
        except Exception as e:  # a truncated zip, a missing array, bad JSON
            raise ScorerFileError(f"{path}: not a readable predicted_kvzip scorer ({type(e).__name__}: {e}); "
                                  "fit it again with python -m mnn_h2o.tools.fit_scorer") from None
        if meta.get("format") != FORMAT:
            raise ScorerFileError(f"{path}: scorer format {meta.get('format')}, this version reads {FORMAT}")
        if meta.get("source_sha256") != source_sha256:
            raise ScorerFileError(f"{path}: fitted for the model with sha256 {meta.get('source_sha256')}, "
                                  f"not this export's {source_sha256}")
        want = (n_layers, hidden + 1, n_kv_heads)
        if weights.shape != want or len(layers) != 2 or not 0 <= layers[0] < layers[1] <= n_layers:
            raise ScorerFileError(f"{path}: weights {weights.shape} and layers {layers} do not fit the model "
                                  f"({want}, layers within [0, {n_layers}])")
        if not isinstance(meta.get("query_peaks", False), bool):
            raise ScorerFileError(f"{path}: meta's query_peaks is {meta.get('query_peaks')!r}, not true or false")
        share = meta.get("prompt_end_share", 0.0)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ScorerFileError(f"{path}: meta's prompt_end_share is {share!r}, not a number in [0, 1]")
        if not np.all(np.isfinite(weights)):
            raise ScorerFileError(f"{path}: weights hold non-finite values")
        return cls(weights, layers, meta)


def scorer_path(export_dir: str) -> str:
    return os.path.join(export_dir, FILE_NAME)


def shipped_path(source_sha256: str) -> str:
    """Where the package keeps the scorer fitted for the GGUF with this digest (fit_scorer --ship)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "scorers", source_sha256[:16] + ".npz")


def default_policy(source_sha256: str) -> str:
    """What eviction.policy auto is for the GGUF with this digest: predicted_kvzip where the package
    ships its scorer (a scorer ships only once its dev-split frontier is within the bar of kvzip's,
    tests/test_token_scorer.py holds each to it), else kvzip. A scorer a user fitted beside an
    export is used when asked for by name, never chosen for them."""
    return "predicted_kvzip" if os.path.exists(shipped_path(source_sha256)) else "kvzip"


def load_for_export(export_dir: str, meta: dict, config) -> TokenScorer:
    """The export's scorer (else the package's for its GGUF), or ScorerFileError saying how to make it."""
    path = scorer_path(export_dir)
    if not os.path.exists(path) and os.path.exists(shipped_path(meta["source_sha256"])):
        path = shipped_path(meta["source_sha256"])
    if not os.path.exists(path):
        raise ScorerFileError(
            f"eviction.policy predicted_kvzip needs the scorer fitted for this model, and {path} does not exist: "
            f"python -m mnn_h2o.tools.fit_scorer --export {export_dir} makes it (a few minutes once per model: "
            "kvzip passes over dev-split text)")
    return TokenScorer.load(path, meta["source_sha256"], config.n_layers, config.hidden, config.n_kv_heads)


def check_layers(scorer: TokenScorer, layers: Sequence[int]) -> None:
    """ScorerFileError unless the fit covers the evicting layers [start, end) a config asks for."""
    if layers[0] < scorer.layers[0] or layers[1] > scorer.layers[1]:
        raise ScorerFileError(f"the predicted_kvzip scorer was fitted for layers [{scorer.layers[0]}, "
                              f"{scorer.layers[1]}), the config evicts [{layers[0]}, {layers[1]})")
