"""`pdserve cutover`: move a deployment between the single-server layout and PD, with a way back."""
