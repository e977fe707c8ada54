"""The collective counter of ``vccc bench scale`` (benchmarks/scale.py) on a small hand-written
HLO module shaped like the trainer's step: an update loop (2 trips) holding a rollout loop
(T = 16 trips), an epoch loop (4) and inside it a minibatch loop (M trips). Counts written by
hand from the text below; nothing is compiled."""

import pytest

from vccc_jax.benchmarks import scale as b

HLO = """HloModule jit__train_impl, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%helper (h: f32[4]) -> f32[4] {
  %h = f32[4]{0} parameter(0)
  ROOT %all-to-all.6 = f32[4]{0} all-to-all(%h), channel_id=6, dimensions={0}
}

%rollout_body (r: (s32[], f32[4])) -> (s32[], f32[4]) {
  %r = (s32[], f32[4]) parameter(0)
  %x = f32[4]{0} get-tuple-element(%r), index=1
  %collective-permute.7 = f32[4]{0} collective-permute(%x), channel_id=7, source_target_pairs={{0,1},{1,0}}
  %note = f32[4]{0} copy(%x), metadata={op_name="jit(_train_impl)/all-reduce(x)"}
  ROOT %t = (s32[], f32[4]) tuple(%i, %collective-permute.7)
}

%minibatch_body (m: (s32[], f32[4])) -> (s32[], f32[4]) {
  %m = (s32[], f32[4]) parameter(0)
  %g = f32[4]{0} get-tuple-element(%m), index=1
  %all-reduce.5 = (f32[4]{0}, f32[]) all-reduce(%g, %l), channel_id=5, to_apply=%add
  %c = f32[4]{0} call(%g), to_apply=%helper
  ROOT %t = (s32[], f32[4]) tuple(%i, %c)
}

%epoch_body (e: (s32[], f32[4])) -> (s32[], f32[4]) {
  %e = (s32[], f32[4]) parameter(0)
  %all-reduce.3 = f32[4]{0} all-reduce(%mean), channel_id=3, to_apply=%add
  %all-reduce.4 = (f32[4]{0}, f32[4]{0}) all-reduce(%var, %n), channel_id=4, to_apply=%add
  ROOT %while.M = (s32[], f32[4]) while(%e), condition=%cond, body=%minibatch_body, metadata={op_name="jit(_train_impl)/while/body/closed_call/while/body/closed_call/while"}, backend_config={"known_trip_count":{"n":"MB"}}
}

%update_body (u: (s32[], f32[4])) -> (s32[], f32[4]) {
  %u = (s32[], f32[4]) parameter(0)
  %all-gather.1 = f32[256]{0} all-gather(%lr), channel_id=1, dimensions={0}
  %all-reduce-start.2 = f32[] all-reduce-start(%metric), channel_id=2, to_apply=%add
  %all-reduce-done.2 = f32[] all-reduce-done(%all-reduce-start.2)
  %while.T = (s32[], f32[4]) while(%u), condition=%cond, body=%rollout_body, metadata={op_name="jit(_train_impl)/while/body/closed_call/rollout/while"}, backend_config={"known_trip_count":{"n":"16"}}
  ROOT %while.E = (s32[], f32[4]) while(%while.T), condition=%cond, body=%epoch_body, metadata={op_name="jit(_train_impl)/while/body/closed_call/while"}, backend_config={"known_trip_count":{"n":"4"}}
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]) parameter(0)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.9 (arg: f32[4]) -> f32[4] {
  %arg = f32[4]{0} parameter(0)
  %all-reduce.0 = f32[4]{0} all-reduce(%arg), channel_id=9, to_apply=%add
  ROOT %while.U = (s32[], f32[4]) while(%init), condition=%cond, body=%update_body, metadata={op_name="jit(_train_impl)/while"}, backend_config={"known_trip_count":{"n":"2"}}
}
"""


def _nonzero(d):
    return {k: v for k, v in d.items() if v}


def test_count_collectives_counts_instructions_once():
    # 5 all-reduces (entry, the async start -- not its done --, 2 per epoch, 1 per minibatch);
    # the op_name that mentions "all-reduce(" is metadata, not an instruction
    assert b.count_collectives(HLO.replace("MB", "3")) == {
        "all-reduce": 5, "all-gather": 1, "reduce-scatter": 0, "collective-permute": 1,
        "all-to-all": 1}


@pytest.mark.parametrize("mb", [3, 4])  # 4: epoch and minibatch loops of equal trips
def test_collectives_by_loop_and_level(mb):
    loops = b.collectives_by_loop(HLO.replace("MB", str(mb)))
    update, epoch = "_train_impl:2", "closed_call:4"
    assert {k: _nonzero(v) for k, v in loops.items()} == {
        (): {"all-reduce": 1},
        (update,): {"all-reduce": 1, "all-gather": 1},
        (update, "rollout:16"): {"collective-permute": 1},
        (update, epoch): {"all-reduce": 2},
        (update, epoch, f"closed_call:{mb}"): {"all-reduce": 1, "all-to-all": 1}}
    levels = b.collectives_by_level(loops, num_steps=16, epochs=4, minibatches=mb)
    assert {k: _nonzero(v) for k, v in levels.items()} == {
        "per call": {"all-reduce": 1}, "per update": {"all-reduce": 1, "all-gather": 1},
        "per epoch": {"all-reduce": 2}, "per minibatch": {"all-reduce": 1, "all-to-all": 1},
        "per env step": {"collective-permute": 1}, "other": {}}
    total = b.executed_per_update(levels, num_steps=16, epochs=4, minibatches=mb, num_updates=2)
    # all-reduce: 1 per call / 2 updates + 1 + 4 epochs x (2 + mb x 1)
    assert total == {"all-reduce": 0.5 + 1 + 4 * (2 + mb), "all-gather": 1,
                     "reduce-scatter": 0, "collective-permute": 16, "all-to-all": 4 * mb}
    # the same executed totals as the loop-nest product of executed_collectives
    step, every = b.executed_collectives(loops, num_updates=2, num_steps=16)
    assert every == pytest.approx(total) and step["collective-permute"] == 16


def test_level_of_an_unexpected_loop_is_other():
    loops = {("_train_impl:2", "sort:7"): dict.fromkeys(b.COLLECTIVES, 0) | {"all-gather": 1}}
    levels = b.collectives_by_level(loops, num_steps=16, epochs=4, minibatches=4)
    assert levels["other"]["all-gather"] == 1 and levels["per update"]["all-gather"] == 0


def test_format_levels_line_of_vccc_bench_scale():
    from types import SimpleNamespace

    loops = b.collectives_by_loop(HLO.replace("MB", "3"))
    row = b.Row("weak", 4, 16, 0.0, 1.0, 1.0, 1.0, {}, loops)
    args = SimpleNamespace(steps=16, epochs=4, minibatches=3, updates=2)
    assert b.format_levels(row, args) == (
        "weak n=4: per call: all-reduce 1 | per update: all-reduce 1, all-gather 1 | "
        "per epoch: all-reduce 2 | per minibatch: all-reduce 1, all-to-all 1 | "
        "per env step: collective-permute 1 | executed per update (4 epochs x 3 minibatches, "
        "T=16): all-reduce 21.5, all-gather 1, collective-permute 16, all-to-all 12")
    assert "per minibatch" in b.loops_footer([row], args) and "per minibatch" not in \
        b.loops_footer([row])
