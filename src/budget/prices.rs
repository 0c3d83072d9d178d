//! Placeholder until the price table lands (being written beside this).

use super::money::Price;

pub struct PricedModel {
    pub price: Price,
}

pub struct PriceTable;

impl PriceTable {
    pub fn shipped() -> &'static PriceTable {
        &PriceTable
    }

    pub fn lookup(&self, _model: &str) -> Option<&PricedModel> {
        None
    }
}
