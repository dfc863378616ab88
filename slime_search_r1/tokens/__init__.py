"""Where a turn's tokens come from: SGLang's /generate (TOKEN_TRACKING_MODE=manual), or the old slime router."""
