//! The suite catches broken plugins (`broken`) and broken bridges (`broken_bridge`): each
//! rule shown failing on a fixture broken in one way.

mod broken;
mod broken_bridge;
