import sys

from kafka2delta.startup import main

sys.exit(main())
