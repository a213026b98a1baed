"""The measured cost of a decode step per row count, as the draft length reads it."""
import pytest

from ctxengine.engine.step_cost import MIN_SLOPE, PRIOR_SLOPE, TRUSTED, WINDOW, StepCost


def measured(times: dict[int, list[float]]) -> StepCost:
    cost = StepCost()
    for rows, seconds in times.items():
        for s in seconds:
            cost.observe(rows, s)
    return cost


def test_with_nothing_measured_the_prior_line_from_one_row():
    assert StepCost().curve(4) == pytest.approx([0.0, 1.0, 1 + PRIOR_SLOPE, 1 + 2 * PRIOR_SLOPE, 1 + 3 * PRIOR_SLOPE])


def test_a_trusted_count_costs_its_least_time():
    cost = measured({1: [0.012, 0.010, 0.011], 4: [0.020, 0.016, 0.030]})
    assert cost(1) == 0.010 and cost(4) == 0.016  # the load only ever adds time
    assert cost(2) == pytest.approx(0.012) and cost(3) == pytest.approx(0.014)  # on the line between
    assert cost(6) == pytest.approx(0.016 + 2 * PRIOR_SLOPE * 0.010)  # the prior slope past the last


def test_an_untrusted_count_is_never_dearer_than_its_neighbours_line():
    cost = measured({1: [0.010] * TRUSTED, 3: [0.050], 4: [0.016] * TRUSTED})
    assert cost(3) == pytest.approx(0.014)  # one slow sample (another process ran) rules nothing out
    cost = measured({1: [0.010] * TRUSTED, 3: [0.0135], 4: [0.016] * TRUSTED})
    assert cost(3) == 0.0135  # a cheaper sample stands


def test_more_rows_never_cost_less():
    cost = measured({1: [0.010] * TRUSTED, 2: [0.008] * TRUSTED, 3: [0.0102] * TRUSTED})
    # times of other moments do not make a row free: each adds at least MIN_SLOPE of one
    assert cost.curve(3) == pytest.approx([0.0, 0.010, 0.010 * (1 + MIN_SLOPE), 0.010 * (1 + 2 * MIN_SLOPE)])


def test_the_last_times_count_so_a_lasting_load_counts_alike():
    cost = measured({1: [0.005] + [0.010] * WINDOW, 2: [0.012] * WINDOW})
    assert cost(1) == 0.010  # the quiet moment has left the window


def test_one_row_never_measured_is_guessed_from_the_others():
    cost = measured({3: [0.012]})  # speculation verified before any plain step
    assert cost(1) == pytest.approx(0.012 / (1 + 2 * PRIOR_SLOPE))
    assert cost(3) == pytest.approx(0.012)


def test_steps_past_the_table_are_not_recorded():
    cost = StepCost()
    cost.observe(1000, 1.0)
    cost.observe(0, 1.0)
    assert cost.curve(2) == pytest.approx([0.0, 1.0, 1 + PRIOR_SLOPE])


def test_a_curve_is_made_again_after_each_observation_and_not_before():
    times = {1: [0.010] * 3, 4: [0.020] * 3}
    cost = measured(times)
    first = cost.curve(6)
    assert cost.curve(4) == first[:5]  # a shorter one from the same times
    first[2] = 99.0  # the caller's copy: changing it changes nothing kept
    assert cost.curve(6)[2] != 99.0
    cost.observe(4, 0.012)  # a cheaper time moves the line through 1 and 4
    times[4].append(0.012)
    again = cost.curve(6)
    assert again == measured(times).curve(6)  # as if made from scratch
    assert again[4] < first[4]
