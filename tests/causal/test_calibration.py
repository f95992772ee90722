"""The latent mechanism nodes keep correlated symptoms from being counted several times."""
from neuraldbg.causal.calibration import burst_example, experiment


def test_latent_model_is_better_calibrated_than_independent_symptoms():
    res = experiment(n=6000, seed=1)
    lat, naive = res["latent"], res["naive"]
    assert lat.log_loss < naive.log_loss
    assert lat.brier < naive.brier
    assert lat.ece_healthy < naive.ece_healthy
    assert lat.overconfident < naive.overconfident


def test_a_burst_of_instability_symptoms_is_one_piece_of_evidence():
    p = burst_example()
    assert p["naive"] > 0.9  # four symptoms multiplied as if independent
    assert p["latent"] < p["naive"] - 0.15
