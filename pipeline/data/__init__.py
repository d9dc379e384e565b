"""Domain traffic (stage data): loaded, validated, deduplicated and split; the real-text generator; rows
turned into model inputs."""
