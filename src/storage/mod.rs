//! Storage providers (see issue 4).
