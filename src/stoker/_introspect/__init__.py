"""Facts about user objects and scripts that the loader core and the tools both need.

Below the loader and the doctor alike (it imports neither): which part of an object fails to
pickle (:mod:`.pickling`), which open handles a forked worker must not share (:mod:`.handles`),
which large Python containers a dataset holds (:mod:`.containers`), the parsed model of a
training script (:mod:`.script`), where it starts workers outside its ``__main__`` guard
(:mod:`.main_guard`), and the user's frame a warning should name (:mod:`.frames`). No findings,
no output: the doctor turns these into findings, the loader into error messages.
"""
