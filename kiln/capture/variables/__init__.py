"""Variable trackers used by the capture stage's symbolic interpreter."""
