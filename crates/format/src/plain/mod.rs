//! Plain dm-crypt mode (to be written).
