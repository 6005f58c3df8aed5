"""Decoding policies by name. A new policy is one module with a `Policy` subclass plus one line
in the registration loop below (or a `register_policy` call from user code); the loop names none of them.

| name | paper | rule |
|---|---|---|
| `llada` | LLaDA | scheduled top-k by confidence (or random) |
| `threshold`, `factor` | Fast-dLLM | top-1 + all with p >= threshold / the factor rule |
| `entropy` | dParallel | lowest entropy + all with entropy <= tau |
| `entropy_bound` | EB-sampler | lowest entropies while their sum, each one's own left out, stays <= the bound |
| `local_leap` | LocalLeap | anchors relax the bar for their neighbours |
| `credit` | CreditDecoding | decayed token credits fused into the logits |
| `prophet` | Prophet | LLaDA + early commit on a logit gap |
| `learn2pd` | Learn2PD | a learned filter + end-of-text prediction |
| `dream` | Dream | `diffusion_generate`'s timestep schedule and algorithms |
| `token_editing` | LLaDA2.1 | threshold commits + re-deciding committed tokens of the block |
| `jacobi` | Jacobi decoding | fixed-point acceptance of a draft (causal models) |
| `lookahead` | Lookahead decoding | n-grams from a 2-D Jacobi window, verified in the same forward |
| `medusa`, `bpd` | Medusa, blockwise parallel decoding | a tree of trained heads' top-k (BPD: a top-1 chain), greedy or typical acceptance |
| `token_recycling` | Token Recycling | a tree from a table of each token's last top-k successors |
| `spec_diffusion` | SpecDiff, DiffuSpec | a masked-diffusion drafter (a second model in the loop) drafts, the causal model verifies: greedy or speculative sampling |
| `freedave` | FreeDave | drafts of the next k steps verified in one forward: a greedy sampler's output, fewer forwards (`freedave_canvas.py`) |
| `apd` | APD | a diffusion model's left-to-right drafts, committed while they match a mixture with a small causal model (a second model in the loop; `apd_canvas.py`) |
| `assd` | ASSD | an any-order model (XLNet) drafts its next k ranks in one forward and verifies them in a second, speculative sampling: its sequential distribution under the order (`assd_canvas.py`) |
| `wedlm` | WeDLM | a streaming window of masks after a causal model's prefix cache, decided tokens reordered first; entropy + distance penalty below tau (`wedlm_canvas.py`) |
| `multiverse` | Multiverse | a causal model that writes `<Parallel>` blocks forks into one row per outline at `</Goal>` over shared cache blocks and merges the paths without copying (`multiverse_canvas.py`) |
| `hogwild` | Hogwild! | N workers of one causal model write at once over a shared cache, each seeing the others' newest tokens in the same forward; finished steps move into a common history (`hogwild_canvas.py`) |
| `diffusiongemma` | DiffusionGemma | the entropy bound on a uniform-noise canvas, renoising the rest (`uniform_canvas.py`) |
| `genmol` | GenMol | a given canvas's MASKs, the top sampled confidences + annealed Gumbel noise per step, molecular context guidance (`genmol_canvas.py`) |

`jacobi`, `lookahead`, `medusa`, `bpd` and `token_recycling` are draft-and-verify policies
(`draft_verify.DraftVerifyPolicy`): a new one is one module defining `layout`, `start`, `propose`
(and optionally `accept`, `update`); a token-tree one derives from `draft_verify.TreeDraftPolicy`.
"""

from __future__ import annotations

from jaxdllm.decoding.policies.apd import Apd
from jaxdllm.decoding.policies.assd import Assd
from jaxdllm.decoding.policies.base import (Commit, ConfidencePolicy, Policy, StepContext, choose_tokens,
                                            rank_among, scheduled_count, token_confidence, token_entropy)
from jaxdllm.decoding.policies.credit import Credit
from jaxdllm.decoding.policies.diffusiongemma import DiffusionGemma
from jaxdllm.decoding.policies.draft_verify import DraftVerifyPolicy, VerifyLayout
from jaxdllm.decoding.policies.dream import Dream, dream_timesteps
from jaxdllm.decoding.policies.entropy import Entropy
from jaxdllm.decoding.policies.entropy_bound import EntropyBound, entropy_bound_accept
from jaxdllm.decoding.policies.factor import Factor
from jaxdllm.decoding.policies.hogwild import Hogwild
from jaxdllm.decoding.policies.freedave import FreeDave
from jaxdllm.decoding.policies.genmol import Genmol
from jaxdllm.decoding.policies.jacobi import Jacobi
from jaxdllm.decoding.policies.learn2pd import Learn2PD, Learn2PDFilter
from jaxdllm.decoding.policies.llada import Llada
from jaxdllm.decoding.policies.lookahead import Lookahead
from jaxdllm.decoding.policies.medusa import Bpd, Medusa
from jaxdllm.decoding.policies.multiverse import Multiverse
from jaxdllm.decoding.policies.local_leap import LocalLeap
from jaxdllm.decoding.policies.prophet import Prophet
from jaxdllm.decoding.policies.spec_diffusion import SpecDiffusion
from jaxdllm.decoding.policies.threshold import Threshold
from jaxdllm.decoding.policies.token_editing import TokenEditing
from jaxdllm.decoding.policies.token_recycling import TokenRecycling
from jaxdllm.decoding.policies.wedlm import Wedlm
from jaxdllm.registry import Registry

POLICIES: Registry[Policy] = Registry("policy")
register_policy = POLICIES.register  # makes `cls` selectable as SamplerConfig(policy=cls.name)
policy_class = POLICIES.lookup

for _cls in (Llada, Threshold, Factor, Entropy, EntropyBound, LocalLeap, Credit, Prophet, Learn2PD, Dream, Jacobi,
             Lookahead, TokenEditing, DiffusionGemma, Medusa, Bpd, TokenRecycling, FreeDave,
             SpecDiffusion, Apd, Wedlm, Assd, Multiverse, Hogwild, Genmol):
    register_policy(_cls)


__all__ = ["Apd", "Assd", "Bpd", "Commit", "ConfidencePolicy", "Credit", "DiffusionGemma", "DraftVerifyPolicy", "Dream", "Entropy",
           "EntropyBound", "Factor", "FreeDave", "Genmol", "Hogwild", "Jacobi", "Learn2PD", "Learn2PDFilter", "Llada", "LocalLeap",
           "Lookahead", "Medusa", "Multiverse", "POLICIES", "Policy", "Prophet", "SpecDiffusion", "TokenRecycling",
           "StepContext", "Threshold", "TokenEditing", "VerifyLayout", "Wedlm", "choose_tokens", "dream_timesteps",
           "entropy_bound_accept", "policy_class", "rank_among", "register_policy", "scheduled_count",
           "token_confidence", "token_entropy"]
