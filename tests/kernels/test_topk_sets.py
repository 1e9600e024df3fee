"""The tie rule the GPU tests compare top-k sets by (tests/kernels/topk_sets.py), on hand-made rows: it accepts a
difference among positions tied at the k-th score and nothing else."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from tests.kernels.topk_sets import top_k_difference  # noqa: E402

# Row 0 (length 6, top 3): scores 9, 5, 1, 5, 0, 7 -> 0 and 5 above the k-th score 5; 1 and 3 tie at it.
SCORES = torch.tensor([[9.0, 5.0, 1.0, 5.0, 0.0, 7.0, float("nan")]])


def rows(*sets):
    return torch.tensor([list(s) for s in sets], dtype=torch.int32)


def test_equal_sets_in_any_order_agree():
    assert top_k_difference(rows((5, 0, 1)), rows((0, 1, 5)), SCORES, [6], 3) is None


def test_a_difference_among_positions_tied_at_the_kth_score_is_accepted_and_said(capsys):
    assert top_k_difference(rows((0, 5, 1)), rows((0, 5, 3)), SCORES, [6], 3) is None
    assert "only among the 2 positions tied at the k-th score 5.0" in capsys.readouterr().out


@pytest.mark.parametrize("a,b,problem", [
    ((0, 5, 1), (0, 1, 3), "the second set is no top-3"),          # drops 5 (score 7) for a tied one
    ((0, 5, 1), (0, 5, 2), "the second set is no top-3"),          # 2 scores 1, below the k-th
    ((0, 5, 1), (0, 5, 5), "the second set is no top-3"),          # a position twice
    ((0, 5, 1), (0, 5, 6), "the second set is no top-3"),          # past the length
    ((0, 5, 1), (0, 5, -1), "the second set is no top-3"),         # padding in a long row
    ((0, 2, 1), (0, 5, 1), "the first set is no top-3"),
])
def test_anything_but_a_tie_difference_is_named(a, b, problem):
    assert problem in top_k_difference(rows(a), rows(b), SCORES, [6], 3)


def test_rows_up_to_topk_long_must_be_equal():
    assert top_k_difference(rows((0, 1, -1)), rows((0, 1, -1)), SCORES, [2], 3) is None
    assert "row 0 (length 2 <= 3) differs" in top_k_difference(rows((0, 1, -1)), rows((1, 0, 2)), SCORES, [2], 3)
