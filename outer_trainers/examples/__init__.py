"""Small TruncatedSteps that show what estimators do: influence balancing (the PES paper's toy)."""
