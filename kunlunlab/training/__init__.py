"""Training: dual-mode rewards, format cold start (SFT) and DAPO through TRL, the end-to-end pipeline."""
