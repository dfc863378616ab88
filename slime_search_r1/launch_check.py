"""`python -m slime_search_r1.launch_check`: the plugin's launch checks on their own (an alias of
slime_search_r1.launch.checks, which run_qwen2.5_3B.sh runs as part of python -m slime_search_r1.launch)."""

import sys

from slime_search_r1.launch.checks import check_launch, configs_from_source, main  # noqa: F401 (the old names)

if __name__ == "__main__":
    sys.exit(main())
