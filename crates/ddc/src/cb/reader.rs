//! Reading compact binary in place. [`parse`] validates a whole body once (every rule of
//! compact-binary.md section 8, depth bounded); after that, [`Field`]s are views into the
//! caller's bytes and their accessors cannot fail on structure.

use super::varuint::read_varuint;
use super::{CbError, CbType, HAS_NAME, MAX_DEPTH};

/// One field: its type, its name (in an object) and its value bytes, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    pub ty: CbType,
    pub name: Option<&'a str>,
    /// The value's encoded bytes (for containers: size, count and children).
    pub value: &'a [u8],
}

/// Validates `body` as one serialized object (a type byte 0x02 or 0x03 without a name, then its
/// value, and nothing after) and returns it.
pub fn parse(body: &[u8]) -> Result<Field<'_>, CbError> {
    let &first = body.first().ok_or(CbError::Truncated)?;
    let ty = CbType::from_byte(first)?;
    if !ty.is_object() || first & HAS_NAME != 0 {
        return Err(CbError::NotAnObject(first));
    }
    let len = value_len(ty, &body[1..])?;
    let trailing = body.len() - 1 - len;
    if trailing != 0 {
        return Err(CbError::TrailingBytes(trailing));
    }
    let field = Field { ty, name: None, value: &body[1..] };
    validate(field, 0)?;
    Ok(field)
}

/// The encoded length of a value of type `ty` at the front of `data`, checked to fit.
fn value_len(ty: CbType, data: &[u8]) -> Result<usize, CbError> {
    let len = match ty.fixed_size() {
        Some(n) => n,
        None if matches!(ty, CbType::IntegerPositive | CbType::IntegerNegative) => read_varuint(data)?.1,
        None => {
            let (size, used) = read_varuint(data)?;
            usize::try_from(size).ok().and_then(|s| s.checked_add(used)).ok_or(CbError::Truncated)?
        }
    };
    if len > data.len() {
        return Err(CbError::Truncated);
    }
    Ok(len)
}

/// Reads one field at the front of `data`: with its own type byte unless `uniform` gives the
/// type, and with a name when `named`. Returns it and the bytes it took.
fn read_field(data: &[u8], uniform: Option<u8>, named: bool) -> Result<(Field<'_>, usize), CbError> {
    let mut at = 0;
    let type_byte = match uniform {
        Some(t) => t,
        None => {
            at = 1;
            *data.first().ok_or(CbError::Truncated)?
        }
    };
    let ty = CbType::from_byte(type_byte)?;
    if (type_byte & HAS_NAME != 0) != named {
        return Err(CbError::Naming);
    }
    let name = if named {
        let (len, used) = read_varuint(&data[at..])?;
        let start = at + used;
        let end = usize::try_from(len).ok().and_then(|l| start.checked_add(l)).ok_or(CbError::Truncated)?;
        let bytes = data.get(start..end).ok_or(CbError::Truncated)?;
        if bytes.is_empty() {
            return Err(CbError::EmptyName);
        }
        at = end;
        Some(std::str::from_utf8(bytes).map_err(|_| CbError::Utf8)?)
    } else {
        None
    };
    let len = value_len(ty, &data[at..])?;
    Ok((Field { ty, name, value: &data[at..at + len] }, at + len))
}

/// Checks a field and everything below it.
fn validate(field: Field<'_>, depth: usize) -> Result<(), CbError> {
    if depth > MAX_DEPTH {
        return Err(CbError::TooDeep(MAX_DEPTH));
    }
    match field.ty {
        CbType::String => {
            std::str::from_utf8(field.payload()).map_err(|_| CbError::Utf8)?;
        }
        CbType::Object | CbType::UniformObject | CbType::Array | CbType::UniformArray => {
            // Unique names are a "should" (section 8.6); duplicates are accepted, as the engine
            // does, so names are not collected.
            let mut children = field.children()?;
            let declared = children.count;
            let mut found = 0u64;
            while let Some(child) = children.next_checked()? {
                found += 1;
                validate(child, depth + 1)?;
            }
            if let Some(declared) = declared
                && declared != found
            {
                return Err(CbError::ItemCount { declared, found });
            }
        }
        _ => {}
    }
    Ok(())
}

impl<'a> Field<'a> {
    /// For sized types (containers, Binary, String, Custom): the bytes after the size.
    fn payload(&self) -> &'a [u8] {
        match read_varuint(self.value) {
            Ok((_, used)) => &self.value[used..],
            Err(_) => &[],
        }
    }

    /// The children of an object or array, lazily; fails on anything else.
    fn children(&self) -> Result<Fields<'a>, CbError> {
        let payload = self.payload();
        let (count, rest) = if self.ty.is_array() {
            let (n, used) = read_varuint(payload)?;
            (Some(n), &payload[used..])
        } else if self.ty.is_object() {
            (None, payload)
        } else {
            return Ok(Fields::EMPTY);
        };
        let named = self.ty.is_object();
        let (uniform, data) = match self.ty {
            CbType::UniformObject | CbType::UniformArray => {
                if count == Some(0) || rest.is_empty() && count.is_none() {
                    // An empty container is never uniform; tolerate it when it is empty anyway.
                    (None, rest)
                } else {
                    let &t = rest.first().ok_or(CbError::Truncated)?;
                    let item = CbType::from_byte(t)?;
                    if self.ty == CbType::UniformArray && item.is_empty_value() {
                        return Err(CbError::EmptyUniformItem(t));
                    }
                    (Some(t), &rest[1..])
                }
            }
            _ => (None, rest),
        };
        Ok(Fields { data, uniform, named, count })
    }

    /// The fields of an object or the items of an array (empty for other types). Only for a
    /// field from [`parse`], which validated it.
    pub fn iter(&self) -> Fields<'a> {
        self.children().unwrap_or(Fields::EMPTY)
    }

    /// The field named `name` of an object.
    pub fn get(&self, name: &str) -> Option<Field<'a>> {
        self.iter().find(|f| f.name == Some(name))
    }

    pub fn as_str(&self) -> Option<&'a str> {
        (self.ty == CbType::String).then(|| std::str::from_utf8(self.payload()).ok()).flatten()
    }

    pub fn as_binary(&self) -> Option<&'a [u8]> {
        (self.ty == CbType::Binary).then(|| self.payload())
    }

    /// A positive integer, or a negative one that fits.
    pub fn as_i128(&self) -> Option<i128> {
        let (v, _) = read_varuint(self.value).ok()?;
        match self.ty {
            CbType::IntegerPositive => Some(i128::from(v)),
            CbType::IntegerNegative => Some(-1 - i128::from(v)),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// The 20 bytes of a Hash, ObjectAttachment or BinaryAttachment.
    pub fn as_hash(&self) -> Option<[u8; 20]> {
        matches!(self.ty, CbType::Hash | CbType::ObjectAttachment | CbType::BinaryAttachment)
            .then(|| self.value.try_into().ok())
            .flatten()
    }

    /// Every ObjectAttachment and BinaryAttachment below this field, in document order.
    pub fn attachments(&self) -> Vec<(CbType, [u8; 20])> {
        self.attachments_within(usize::MAX).unwrap_or_default()
    }

    /// [`Field::attachments`], unless there are more than `max`: then `None`, having collected
    /// no more than `max` (a hostile object naming a million costs no more than its bound).
    pub fn attachments_within(&self, max: usize) -> Option<Vec<(CbType, [u8; 20])>> {
        let mut out = Vec::new();
        self.collect_attachments(&mut out, max).then_some(out)
    }

    /// False once more than `max` were found.
    fn collect_attachments(&self, out: &mut Vec<(CbType, [u8; 20])>, max: usize) -> bool {
        match self.ty {
            CbType::ObjectAttachment | CbType::BinaryAttachment => {
                if let Some(h) = self.as_hash() {
                    if out.len() == max {
                        return false;
                    }
                    out.push((self.ty, h));
                }
                true
            }
            t if t.is_object() || t.is_array() => {
                self.iter().all(|child| child.collect_attachments(out, max))
            }
            _ => true,
        }
    }
}

/// The children of an object or array.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    data: &'a [u8],
    uniform: Option<u8>,
    named: bool,
    /// Declared item count of an array.
    count: Option<u64>,
}

impl<'a> Fields<'a> {
    /// No children: what a field that is not a container has.
    const EMPTY: Fields<'static> = Fields { data: &[], uniform: None, named: false, count: Some(0) };

    fn next_checked(&mut self) -> Result<Option<Field<'a>>, CbError> {
        if self.data.is_empty() {
            return Ok(None);
        }
        let (field, used) = read_field(self.data, self.uniform, self.named)?;
        if used == 0 {
            return Err(CbError::Size);
        }
        self.data = &self.data[used..];
        Ok(Some(field))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Field<'a>;

    fn next(&mut self) -> Option<Field<'a>> {
        self.next_checked().ok().flatten()
    }
}
