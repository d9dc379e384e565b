"""What every step uses: one error type, value checks, atomic IO, typed records at stage seams, the stage
runner, names, redaction, file sizes and the artifact layout."""
