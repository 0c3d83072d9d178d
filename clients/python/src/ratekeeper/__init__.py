"""ratekeeper client."""
