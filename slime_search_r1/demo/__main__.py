"""`python -m slime_search_r1.demo`: the offline rollout demo (rollouts.py)."""

import sys

from slime_search_r1.demo.rollouts import main

sys.exit(main())
