"""`python -m recipe.darl.main_darl`: the original D-ARL repository's name for the one-step-off entry point
(`recipe.darl.main_one_step_off`), kept so its launch scripts run unchanged."""

import sys

from recipe.darl.main_one_step_off import main, rewrite_plus_overrides

if __name__ == "__main__":
    sys.argv[1:] = rewrite_plus_overrides(sys.argv[1:])
    main()
