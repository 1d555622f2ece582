//! What one player may see of a state, computed directly from the policies.
//!
//! This is the specification the encoders must meet: a replica fed a snapshot and then every
//! update for `player` equals `state.view_for(player)`. The property tests check exactly that.

use crate::schema::{Kind, ROOT, Schema, TypeId, Vis};
use crate::state::State;
use crate::tree::Node;
use crate::value::{Key, Value};

impl State {
    /// The state as `player` may see it: server-only fields at their defaults, owner-only maps cut
    /// to `player`'s own entry, custom fields filtered for `player`.
    pub fn view_for(&self, player: &Key) -> Value {
        view(&self.schema, ROOT, &self.root.node, player)
    }
}

fn view(schema: &Schema, ty: TypeId, node: &Node, player: &Key) -> Value {
    match (&schema.node(ty).kind, node) {
        (Kind::Struct(fields), Node::Struct(slots)) => Value::Struct(
            fields
                .iter()
                .zip(slots.iter())
                .map(|(field, slot)| match field.vis {
                    Vis::ServerOnly => schema.default_value(field.ty),
                    Vis::Broadcast => view(schema, field.ty, &slot.node, player),
                    Vis::OwnerOnly => match (&schema.node(field.ty).kind, &slot.node) {
                        (Kind::Map { value, .. }, Node::Map(map)) => Value::Map(
                            map.get(player)
                                .map(|e| (player.clone(), view(schema, *value, &e.slot.node, player)))
                                .into_iter()
                                .collect(),
                        ),
                        _ => unreachable!("owner_only fields are maps"),
                    },
                    Vis::Custom(filter) => (schema.filters[filter as usize])(player, &slot.node.to_value())
                        .and_then(|v| Node::from_value(schema, field.ty, v, 0).ok())
                        .map_or_else(
                            || schema.default_value(field.ty),
                            |n| view(schema, field.ty, &n, player),
                        ),
                })
                .collect(),
        ),
        (Kind::List(item), Node::List(list)) => {
            Value::List(list.items.iter().map(|s| view(schema, *item, &s.node, player)).collect())
        }
        (Kind::Map { value, .. }, Node::Map(map)) => Value::Map(
            map.iter().map(|e| (e.key.clone(), view(schema, *value, &e.slot.node, player))).collect(),
        ),
        _ => node.to_value(),
    }
}
