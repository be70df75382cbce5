import sys

from kafka2delta.cli import main

sys.exit(main())
