"""The kernel ``make grade`` starts for a student's notebook (tools/grade.py runs it, in the
sandbox when there is one): ``python tools/grade_kernel.py RUN_FOLDER -f CONNECTION_FILE``.

Before any cell runs, it imports the course's ``hooklab`` (the notebook's folder, which holds
nothing but the notebook, is put on ``sys.path`` only afterwards) and starts its verdict log
(``hooklab.exercises._start_grading``: the run's key is read and deleted, the log's first line
says where hooklab came from and the hash of its files); then it is an ordinary IPython kernel.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    folder = sys.argv.pop(1)
    del sys.path[0]  # this script's folder (tools/): not for the student's imports
    from hooklab.exercises import _start_grading

    _start_grading(folder)
    sys.path.insert(0, os.getcwd())  # as `python -m ipykernel_launcher` has it: the notebook's folder first
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
