"""An experiment: a config, its compiled programs, its run directory and the loop.

    config.py     EvolveConfig (what is evolved, saved with a run), RunOptions (how it runs)
    programs.py   build(config) and the compiled init / generation / evaluation programs
    run_dir.py    a run directory's files, starting or resuming one, load_policy
    evolve.py     the loop: programs + sinks + checkpoints
"""
