"""Configuration and pre-registration: where configs, models and data come from, what a method config may
name and set, the experiment's settings, the frozen pre-registration and its typed analysis plan. Torch-free."""
