//! The configuration file (see issue 3).
