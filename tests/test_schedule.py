"""Learning-rate schedules (nmtkit.train.schedule) as functions of the update and the validations; the optimizers read
the rate each step.  Training runs with them, their logs and their exact resumption are in test_train_schedules.py."""

from __future__ import annotations

import math

import pytest
import torch

from nmtkit.train.adadelta import Adadelta
from nmtkit.train.schedule import make_schedule, schedule_class


def test_constant_is_the_rate_given_and_warms_up_linearly():
    s = make_schedule("constant", 0.3)
    assert [s.lr(u) for u in (1, 2, 1000)] == [0.3, 0.3, 0.3]
    s = make_schedule("constant", 0.3, warmup=4)
    assert [s.lr(u) for u in range(1, 7)] == pytest.approx([0.075, 0.15, 0.225, 0.3, 0.3, 0.3], rel=1e-15)
    assert s.lr(4) == 0.3  # the full rate at the end of the warm-up, exactly


def test_inverse_sqrt():
    s = make_schedule("inverse-sqrt", 0.1, warmup=4)
    assert s.lr(1) == pytest.approx(0.025) and s.lr(4) == pytest.approx(0.1)
    assert [s.lr(u) for u in (16, 100, 400)] == pytest.approx([0.05, 0.02, 0.01])
    assert make_schedule("inverse-sqrt", 0.1, warmup=4, min_lr=0.03).lr(400) == 0.03  # floored
    s = make_schedule("inverse-sqrt", 0.1)  # no warm-up: lr / sqrt(u), the full rate at the first update
    assert [s.lr(u) for u in (1, 4, 25)] == pytest.approx([0.1, 0.05, 0.02])


def test_linear_and_cosine_decay_from_the_warm_up_to_the_floor_at_the_last_update():
    s = make_schedule("linear", 0.1, warmup=2, total=12)
    assert [s.lr(u) for u in (1, 2)] == pytest.approx([0.05, 0.1])  # warm-up as with every scheduler
    assert [s.lr(u) for u in (3, 7, 11, 12)] == pytest.approx([0.09, 0.05, 0.01, 0.0], abs=1e-15)
    assert s.lr(20) == 0.0  # past the last update (a resumed run given more updates): the floor
    s = make_schedule("linear", 0.1, total=4, min_lr=0.02)  # no warm-up: the first update already decays
    assert [s.lr(u) for u in (1, 2, 3, 4)] == pytest.approx([0.08, 0.06, 0.04, 0.02])
    c = make_schedule("cosine", 0.1, warmup=2, total=12)
    assert c.lr(2) == pytest.approx(0.1) and c.lr(7) == pytest.approx(0.05) and c.lr(12) == pytest.approx(0.0)
    assert c.lr(4) == pytest.approx(0.05 * (1 + math.cos(math.pi * 0.2)))
    assert all(c.lr(u) > c.lr(u + 1) for u in range(2, 12))
    assert make_schedule("cosine", 0.1, total=10, min_lr=0.01).lr(10) == pytest.approx(0.01)
    for kind in ("linear", "cosine"):
        with pytest.raises(ValueError, match="needs a last update after the warm-up"):
            make_schedule(kind, 0.1, warmup=5, total=5)
        # a resumed run told another last update says so (the trainer logs it as a warning)
        resumed = make_schedule(kind, 0.1, total=20)
        assert resumed.load_state_dict(make_schedule(kind, 0.1, total=12).state_dict()) == \
            f"the {kind} schedule now reaches its floor at update 20, not 12"
        assert make_schedule(kind, 0.1, total=12).load_state_dict(make_schedule(kind, 0.1, total=12).state_dict()) is None


def test_decay_fraction_holds_the_rate_then_decays_over_the_last_part():
    s = make_schedule("linear", 0.1, warmup=2, total=12, decay_fraction=0.5)  # span 2..12: hold to 7, decay to 12
    assert [s.lr(u) for u in (2, 5, 7)] == pytest.approx([0.1, 0.1, 0.1])
    assert [s.lr(u) for u in (8, 10, 12)] == pytest.approx([0.08, 0.04, 0.0], abs=1e-15)
    c = make_schedule("cosine", 0.1, total=10, decay_fraction=0.2)  # hold to 8, then half a cosine to 10
    assert c.lr(8) == pytest.approx(0.1) and c.lr(9) == pytest.approx(0.05) and c.lr(10) == pytest.approx(0.0)
    assert make_schedule("linear", 0.1, total=10).lr(5) == make_schedule("linear", 0.1, total=10, decay_fraction=1).lr(5)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="decay fraction must be in"):
            make_schedule("linear", 0.1, total=10, decay_fraction=bad)


def test_a_time_budget_is_carried_to_updates_at_the_rate_so_far():
    """--max-time without an update horizon: before update u, e seconds into the run, the horizon is (u-1)·B/e, so
    the rate reaches its floor exactly when the clock reaches the budget, whatever the speed."""
    s = make_schedule("linear", 0.1, budget=100.0)
    assert s.lr(1, 0.0) == pytest.approx(0.1)  # nothing measured yet: the full rate
    assert s.horizon(11, 10.0) == pytest.approx(100.0)  # 10 updates in 10 s: 100 updates in 100 s
    assert s.lr(11, 10.0) == pytest.approx(0.1 * (1 - 11 / 100))
    assert s.horizon(11, 50.0) == pytest.approx(20.0)  # a slower machine: 5 s an update, 20 updates in the budget
    assert s.lr(11, 50.0) == pytest.approx(0.1 * (1 - 11 / 20))
    assert s.lr(21, 100.0) == 0.0 and s.lr(30, 150.0) == 0.0  # at and past the budget: the floor
    # the same share of the budget gives the same rate at any speed (no warm-up, linear: q = e·u / ((u-1)·B))
    fast, slow = [s.lr(u, (u - 1) * 0.5) for u in (101, 181)], [s.lr(u, (u - 1) * 5.0) for u in (11, 19)]
    assert fast == pytest.approx([0.1 * (1 - 101 / 200), 0.1 * (1 - 181 / 200)])
    assert slow == pytest.approx([0.1 * (1 - 11 / 20), 0.1 * (1 - 19 / 20)])
    # with warm-up and an update limit too: whichever horizon comes first
    w = make_schedule("cosine", 0.1, warmup=4, total=50, budget=100.0, min_lr=0.01)
    assert w.lr(4, 3.0) == pytest.approx(0.1)  # warm-up as always
    assert w.horizon(21, 10.0) == 50 and w.horizon(21, 80.0) == pytest.approx(25.0)
    assert w.lr(50, 10.0) == pytest.approx(0.01) and w.lr(25, 96.0) == pytest.approx(0.01)
    # the state names the budget; a resumed run given another says so
    assert w.state_dict() == {"factor": 1.0, "bad": 0, "best": None, "total": 50, "budget": 100.0,
                              "decay_fraction": 1.0}
    again = make_schedule("linear", 0.1, budget=200.0)
    assert again.load_state_dict(s.state_dict()) == "the linear schedule now has a time budget of 200 s, not 100 s"
    assert make_schedule("linear", 0.1, budget=100.0).load_state_dict(s.state_dict()) is None


def test_plateau_decays_after_patience_bad_validations_down_to_the_floor():
    s = make_schedule("plateau", 1.0, warmup=2, decay=0.5, patience=2, min_lr=0.2)
    assert s.lr(1) == 0.5
    assert s.on_validation(2, 9.0) is False and s.best is None  # in the warm-up: not counted, not even as the best
    assert s.on_validation(4, 1.0) is False and s.best == 1.0  # the first best (metric: higher is better)
    assert s.on_validation(6, 0.5) is False and s.bad == 1
    assert s.on_validation(8, 0.7) is True  # not better than 1.0: the second bad validation in a row
    assert s.lr(9) == 0.5 and s.state_dict() == {"factor": 0.5, "bad": 0, "best": 1.0}
    assert s.on_validation(10, 2.0) is False and (s.best, s.bad) == (2.0, 0)  # an improvement restarts the count
    assert [s.on_validation(u, 1.0) for u in (12, 14)] == [False, True] and s.lr(15) == 0.25
    assert [s.on_validation(u, 1.0) for u in (16, 18)] == [False, True] and s.lr(19) == 0.2  # 0.125: the floor
    assert [s.on_validation(u, 1.0) for u in (20, 22)] == [False, False] and s.factor == 0.125  # at the floor
    assert s.lr(1) == 0.5  # the warm-up is not floored
    # the state carries over
    t = make_schedule("plateau", 1.0, warmup=2, decay=0.5, patience=2, min_lr=0.2)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict() and t.lr(100) == s.lr(100)


def test_schedules_other_than_plateau_ignore_validations():
    for kind in ("constant", "inverse-sqrt", "linear", "cosine"):
        s = make_schedule(kind, 1.0, patience=1, total=10)
        assert not any(s.on_validation(u, -u) for u in range(1, 10))
        assert s.state_dict() == {"factor": 1.0, "bad": 0, "best": None, **({"total": 10, "budget": 0.0, "decay_fraction": 1.0} if schedule_class(kind).budgeted else {})}


def test_adadelta_takes_the_rate_from_its_group_at_every_step():
    """The trainer writes the schedule's rate into group["lr"] before each step: nmtkit's Adadelta (blocked or
    compiled) moves by exactly what torch's moves with the same rates; a rate of 0 leaves the weights alone."""
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(30, 7)), torch.nn.Parameter(torch.randn(50))]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opt_ref, opt_ours = torch.optim.Adadelta(ref, lr=1.0), Adadelta(ours, lr=1.0)
    for k, lr in enumerate((0.5, 0.0, 2.0, 1.0)):
        for opt in (opt_ref, opt_ours):
            for group in opt.param_groups:
                group["lr"] = lr
        before = [p.detach().clone() for p in ours]
        for a, b in zip(ref, ours):
            a.grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(k))
            b.grad = a.grad.clone()
        opt_ref.step()
        opt_ours.step()
        for a, b, c in zip(ref, ours, before):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
            assert torch.equal(b, c) == (lr == 0.0)
    assert math.isclose(opt_ours.param_groups[0]["lr"], 1.0)
