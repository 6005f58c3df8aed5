"""Multiverse Attention (`MaskSpec(kind="multiverse")`, `jaxdllm.attention.multiverse`) against the published
rules written out independently (`tests/support/multiverse_reference.py`: a stack walk over a Python list),
and a model-level check of path independence on the shipped causal model."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdllm.attention import MaskSpec, attend, resolve_impl
from jaxdllm.attention.backends import gpu_auto
from jaxdllm.attention.multiverse import multiverse_attention, multiverse_layout
from jaxdllm.data.multiverse_tags import TAG_IDS, TAGS, build_tag_tokenizer
from jaxdllm.errors import ConfigError
from support.forward import forward
from support.multiverse_reference import reference_layout, split_tokens

TOK = build_tag_tokenizer()
IDS = list(TAG_IDS.values())

SEQUENCES = {
    "two paths": "q=<Parallel><Goal><Outline>1</Outline><Outline>2</Outline></Goal><Path>1:ab</Path>"
                 "<Path>2:cde</Path><Conclusion>x</Conclusion></Parallel>y",
    "text between spans": "<Parallel><Goal>g</Goal>\n<Path>1:aaaa</Path>\n\n<Path>2:b</Path>\n<Path>3:cc</Path>"
                          "\n<Conclusion>zz</Conclusion>\n</Parallel>tail",
    "path-less": "ab<Parallel><Goal><Outline>1</Outline></Goal><Conclusion>c</Conclusion></Parallel>de",
    "nested": "s<Parallel><Goal>G</Goal><Path>1:a<Parallel><Goal>h</Goal><Path>1.1:xy</Path><Path>1.2:z</Path>"
              "<Conclusion>w</Conclusion></Parallel>b</Path><Path>2:cccc</Path><Conclusion>k</Conclusion></Parallel>e",
    "two blocks in a row": "<Parallel><Goal>a</Goal><Path>1</Path><Path>22</Path><Conclusion>c</Conclusion></Parallel>"
                           "<Parallel><Goal>b</Goal><Path>333</Path><Path>4</Path><Conclusion>d</Conclusion>"
                           "</Parallel>",
    "depth three": "<Parallel><Goal>1</Goal><Path>a<Parallel><Goal>2</Goal><Path>b<Parallel><Goal>3</Goal>"
                   "<Path>c</Path><Path>dd</Path><Conclusion>e</Conclusion></Parallel></Path><Path>f</Path>"
                   "<Conclusion>g</Conclusion></Parallel></Path><Path>hhh</Path><Conclusion>i</Conclusion></Parallel>",
    "no tags": "plain causal text",
    "no goal": "<Parallel><Path>ab</Path><Path>c</Path><Conclusion>d</Conclusion></Parallel>",
}


def encode(text):
    ids = TOK.encode(text, add_special_tokens=False)
    assert [TOK.decode([i]) for i in ids] == split_tokens(text, TAGS)  # one token per tag or character
    return ids


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_layout_and_mask_match_the_published_rules(name):
    text = SEQUENCES[name]
    ids = encode(text)
    want_pos, want_mask = reference_layout(split_tokens(text, TAGS))
    if name not in ("no tags", "path-less"):  # (a block without paths masks nothing)
        assert not want_mask[np.tril_indices(len(ids))].all()  # the rule masks something here
    for impl_mask, positions in [multiverse_attention(jnp.array([ids]), IDS)]:
        np.testing.assert_array_equal(np.asarray(positions)[0], want_pos)
        np.testing.assert_array_equal(np.asarray(impl_mask.dense(len(ids), len(ids)))[0], want_mask)


def test_rows_of_a_batch_with_padding_and_segment_ids():
    texts = [SEQUENCES["two paths"], SEQUENCES["nested"], SEQUENCES["path-less"]]
    rows = [encode(t) for t in texts]
    n = max(map(len, rows)) + 3
    ids = np.zeros((len(rows), n), np.int32)
    seg = np.zeros((len(rows), n), np.int32)
    for r, row in enumerate(rows):
        ids[r, :len(row)], seg[r, :len(row)] = row, 1
    mask, positions = multiverse_attention(jnp.asarray(ids), IDS, segment_ids=jnp.asarray(seg))
    dense = np.asarray(mask.dense(n, n))
    for r, (text, row) in enumerate(zip(texts, rows)):
        want_pos, want_mask = reference_layout(split_tokens(text, TAGS) + ["<pad>"] * (n - len(row)))
        np.testing.assert_array_equal(np.asarray(positions)[r], want_pos)  # padding follows on
        real = seg[r] > 0
        want = want_mask & (real[:, None] == real[None, :])
        np.testing.assert_array_equal(dense[r], want)


def test_a_query_offset_reads_the_structure_of_its_own_rows():
    ids = jnp.array([encode(SEQUENCES["nested"])])
    mask, _ = multiverse_attention(ids, IDS)
    n = ids.shape[1]
    full = np.asarray(mask.dense(n, n))
    np.testing.assert_array_equal(np.asarray(mask.replace(q_offset=n - 7).dense(7, n)), full[:, n - 7:])


def test_the_dense_backends_agree_and_the_kernels_refuse_with_the_backends_named():
    ids = jnp.array([encode(SEQUENCES["two paths"])])
    mask, _ = multiverse_attention(ids, IDS)
    rng = np.random.default_rng(0)
    n = ids.shape[1]
    q, k, v = (jnp.asarray(rng.normal(size=(1, n, 4, 8)), jnp.float32) for _ in range(3))
    ref = np.asarray(attend(q, k, v, mask, impl="reference"))
    np.testing.assert_allclose(np.asarray(attend(q, k, v, mask, impl="xla")), ref, atol=1e-5)
    # the reference's dense softmax equals a plain masked softmax over the reference rule's matrix
    _, want = reference_layout(split_tokens(SEQUENCES["two paths"], TAGS))
    s = np.einsum("qhd,khd->hqk", np.asarray(q[0]), np.asarray(k[0])) / np.sqrt(8)
    s = np.where(want[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(ref[0], np.einsum("hqk,khd->qhd", p, np.asarray(v[0])), atol=1e-5)
    for impl in ("pallas", "splash"):
        with pytest.raises(ConfigError, match="reference.*xla"):
            attend(q, k, v, mask, impl=impl)
    assert gpu_auto(mask, q.astype(jnp.bfloat16), k) == "xla"
    assert resolve_impl("auto", backend="gpu", mask=mask, q=q, k=k) == "xla"


def test_bad_structure_is_refused():
    with pytest.raises(ConfigError, match="parallel_ids and path_ids"):
        MaskSpec(kind="multiverse")
    with pytest.raises(ConfigError, match="no other kind"):
        MaskSpec(kind="causal", parallel_ids=jnp.zeros((1, 4, 2), jnp.int32), path_ids=jnp.zeros((1, 4, 2), jnp.int32))
    with pytest.raises(ConfigError, match="12 distinct"):
        multiverse_layout(jnp.zeros((1, 4), jnp.int32), IDS[:11])
    with pytest.raises(ConfigError, match="max_depth"):
        multiverse_layout(jnp.zeros((1, 4), jnp.int32), IDS, max_depth=0)
    spec = MaskSpec(kind="multiverse", parallel_ids=jnp.zeros((1, 4, 2), jnp.int32),
                    path_ids=jnp.zeros((1, 4, 2), jnp.int32))
    with pytest.raises(ConfigError, match="Lk=6"):
        spec.dense(6, 6)


@nnx.jit  # eager calls dispatch op by op, a compile each on CPU; the mask is built inside
def _multiverse_forward(model, ids):
    mask, positions = multiverse_attention(ids, IDS)
    return model(ids, positions, mask).logits, positions


def test_paths_of_the_shipped_model_are_independent():
    """A path-2 token's logits under the Multiverse mask equal a plain causal forward over the text with
    path 1 cut out, at the positions the rule gives (the shipped causal model, grown to the tags)."""
    from jaxdllm.checkpoint import from_pretrained
    from jaxdllm.checkpoint.resize_vocab import add_multiverse_tags

    model = add_multiverse_tags(from_pretrained("tasks-qwen2-small", attention_impl="xla"), max_position=192)
    text = ("par rev rot: 314 520=<Parallel><Goal><Outline>1</Outline><Outline>2</Outline></Goal>"
            "<Path>1:rev:413 rot:134</Path><Path>2:rev:025 rot:250</Path><Conclusion>12</Conclusion></Parallel>")
    tokens = split_tokens(text, TAGS)
    ids = np.array([encode(text)])
    full, positions = _multiverse_forward(model, jnp.asarray(ids))
    full = np.asarray(full)[0]
    start1 = tokens.index("<Path>")
    start2 = start1 + tokens[start1:].index("</Path>") + 1
    end2 = start2 + tokens[start2:].index("</Path>") + 1
    keep = [i for i in range(len(tokens)) if not start1 <= i < start2]
    pos_ref, _ = reference_layout(tokens)
    cut_ids, cut_pos = ids[:, keep], pos_ref[keep][None]
    cut = np.asarray(forward(model, jnp.asarray(cut_ids), jnp.asarray(cut_pos), MaskSpec(kind="causal")).logits)[0]
    path2 = [keep.index(i) for i in range(start2, end2)]
    np.testing.assert_allclose(full[start2:end2], cut[path2], atol=2e-4, rtol=2e-4)
    # without the mask the path-2 tokens do see path 1: the check has something to find
    causal = np.asarray(forward(model, jnp.asarray(ids), positions, MaskSpec(kind="causal")).logits)[0]
    assert np.abs(causal[start2:end2] - full[start2:end2]).max() > 1e-2
