"""Code that backs one notebook's experiment, apart from the library it studies: the reward cases of notebook
03, STIE's tuning of notebook 05, the evaluation suite of notebook 06 (``kunlunlab suite``) and the training
variants of notebook 07. Above evaluation and training in the layers; only the views, the CLI and the
notebooks import it."""
