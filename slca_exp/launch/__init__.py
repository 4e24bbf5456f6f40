"""Where jobs run: cluster profiles (launchers/), ready studies (sweeps/) and the dry run."""
